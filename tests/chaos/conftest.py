"""The chaos tests' cluster: shards, Postgres, an in-process coordinator and shard loops, the
side-effect table of ``chaos.ledger``; each test adds the processes its faults hit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.chaos import Chaos, chaos_of, create_ledger
from tests.support.cluster import running_cluster
from tests.support.workers import shard_loops


@pytest.fixture
async def chaos(database_url: str, tmp_path: Path) -> AsyncIterator[Chaos]:
    await create_ledger(database_url)
    async with running_cluster(database_url) as cluster, shard_loops(cluster):
        c = chaos_of(cluster, tmp_path)
        try:
            yield c
        finally:
            c.stop_workers()
