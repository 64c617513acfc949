"""Postgres: the schema (:mod:`.db`), its migrations, and the results store (:mod:`.results`)
that workers write and the coordinator reads, as peers.

Nothing here imports the coordinator, the shard or the worker."""
