"""The operator's commands: they talk to Postgres (and, to move tenants, to the shards' Redis)
directly, with ``--database-url``; no coordinator has to run. One module per noun."""

# Nothing is imported here: ``shardq.coordinator.cli.WORDS`` names each noun's module, so
# ``shardq <command>`` loads only its own noun's module and not every other's imports.
