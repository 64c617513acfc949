"""shardq's public API namespace; the generated gRPC code lives in :mod:`shardq.v1`."""
