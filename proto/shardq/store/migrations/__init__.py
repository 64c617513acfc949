"""Alembic migrations of the coordinator's schema; run them with ``shardq migrate``."""
