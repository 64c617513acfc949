"""The API user's commands: they call the coordinator over gRPC through ``shardq.client``, as
a tenant (its token) or for one (the admin token and ``--tenant``). One module per noun."""

# Nothing is imported here: ``shardq.coordinator.cli.WORDS`` names each noun's module, so
# ``shardq <command>`` loads only its own noun's module and not every other's imports.
