"""The kernel every room of shardq shares: errors, validation, settings from flags, the ops
HTTP server, clocks, IDs, the placement rule and the one way to open a shard's Redis.

Nothing here imports another room of shardq; every room may import this."""
