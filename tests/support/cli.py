"""The ``shardq`` command line run in the test process against a real cluster: what its
commands print and return, as a user at a terminal sees them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from shardq.coordinator import cli
from tests.support.cluster import Cluster, running_cluster
from tests.support.postgres import sqlalchemy_url, throwaway_database


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> object:
        return json.loads(self.out)


class Shardq:
    """``shardq ARGV...`` against the cluster: with the token given, else the token of
    ``tenant``, else of ``default_tenant`` (the admin token when that is None)."""

    def __init__(
        self,
        cluster: Cluster,
        capsys: pytest.CaptureFixture[str],
        default_tenant: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.capsys = capsys
        self.default_tenant = default_tenant

    async def __call__(
        self,
        *argv: str,
        token: str | None = None,
        tenant: str | None = None,
        coordinator: str | None = None,
    ) -> Run:
        if token is None:
            who = tenant or self.default_tenant
            token = self.cluster.admin_token if who is None else await self.cluster.token_for(who)
        full = [*argv, "--coordinator", coordinator or self.cluster.target, "--token", token]
        self.capsys.readouterr()
        code = await asyncio.to_thread(cli.main, full)
        captured = self.capsys.readouterr()
        return Run(code, captured.out, captured.err)


def one_error_line(run: Run, code: str) -> str:
    """The one line a failed command prints: ``error: CODE: message``, exit status 1."""
    assert run.code == 1, run
    lines = run.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in run.err, run.err
    assert lines[0].startswith(f"error: {code}: "), lines[0]
    return lines[0]


@asynccontextmanager
async def cluster_of_its_own() -> AsyncIterator[Cluster]:
    """A cluster on a database of its own (a CLI test module shares one between its tests)."""
    with throwaway_database() as url:
        async with running_cluster(sqlalchemy_url(url)) as c:
            yield c
