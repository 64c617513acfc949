"""A database URL whose path to Postgres a test can cut (``CuttableProxy``) and restore."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

from shardq.coordinator.tools.faults import CuttableProxy


@asynccontextmanager
async def proxied_database(database_url: str) -> AsyncIterator[tuple[CuttableProxy, str]]:
    """(the proxy, ``database_url`` through it): ``proxy.cut()`` drops every connection made
    through it and refuses new ones until ``proxy.restore()``. Other URLs of the same
    database keep working, so a test can read or change it while its subject cannot."""
    parts = urlsplit(database_url)
    proxy = CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await proxy.start()
    userinfo, at, _ = parts.netloc.rpartition("@")
    proxied = urlunsplit(parts._replace(netloc=f"{userinfo}{at}127.0.0.1:{proxy.port}"))
    try:
        yield proxy, proxied
    finally:
        await proxy.stop()
