"""The shardq worker runtime."""
