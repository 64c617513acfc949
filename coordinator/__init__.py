"""The front door: the gRPC API over the shards, tenant placement and the shard map, tokens,
the mover, and the `shardq` command line (``cli``) with its local tools (``tools``)."""
