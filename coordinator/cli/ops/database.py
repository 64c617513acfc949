"""The database an operator's command works on: ``--database-url`` (``SHARDQ_DATABASE_URL``);
plain ``postgresql://`` URLs are accepted."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncEngine

from shardq.coordinator.cli.command import CommandError
from shardq.store import db


def database_url(args: argparse.Namespace) -> str:
    url = str(getattr(args, "database_url", "") or "")
    if not url:
        raise CommandError("no database: pass --database-url or set SHARDQ_DATABASE_URL")
    return db.sqlalchemy_url(url)


@asynccontextmanager
async def engine_for(args: argparse.Namespace) -> AsyncIterator[AsyncEngine]:
    engine = db.make_engine(database_url(args))
    try:
        yield engine
    finally:
        await engine.dispose()
