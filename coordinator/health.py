"""Readiness: whether this coordinator can serve, checked in the background, never on a call.

Every ``interval_s`` (2 s) a :class:`ReadinessChecker` runs ``SELECT 1`` on Postgres and
``PING`` on each shard of the current map, each bounded by ``timeout_s`` (1 s), and keeps
each dependency's state and since when it holds. gRPC health (``""`` and each shardq
service) and the ops port's ``/readyz`` report what it decided:

- **not ready when every shard of the map is unreachable**: no submit can succeed here, so
  the Service should send calls elsewhere. One shard down out of several is reported in the
  detail but leaves the coordinator ready: the other shards' tenants are served, and those of
  the lost shard get UNAVAILABLE from any replica alike. An empty map (a fresh install
  before its shard-map hook ran) leaves it ready too: nothing is unreachable, and a
  readiness gate there would hold back the very install that fills the map.
- **Postgres unreachable is reported at once, but makes the coordinator not ready only once
  it has been unreachable for longer than the token cache can cover**,
  ``max(--token-stale-max-s, --token-cache-ttl-s)`` (docs/guarantees.md, "While Postgres is
  away"): until then the front door accepts submits from every token it has seen, and
  taking every replica out of its Service at the first blip would turn a degraded front door
  into no front door. Past that bound every cached token is too old to use (the newest was
  read no later than the first failed check), every call is UNAVAILABLE anyway, and
  readiness says so.

The checks run on their own task and connections' timeouts: a hung dependency delays nothing
but the next check (a Postgres check still running is not started again; it is reported as
not answering).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from shardq.coordinator.placement import ShardMap
from shardq.coordinator.router import ShardPool

log = logging.getLogger("shardq.coordinator.health")

#: Default seconds between two rounds of checks.
DEFAULT_INTERVAL_S = 2.0
#: Default seconds a single check may take before it counts as failed.
DEFAULT_TIMEOUT_S = 1.0


@dataclass(slots=True)
class DependencyState:
    """What the last check of one dependency found, and since when that has held."""

    ok: bool
    error: str
    #: When the dependency entered this state: wall clock (for people) and monotonic.
    since_unix_s: float
    since_mono_s: float

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "error": self.error, "since": round(self.since_unix_s, 3)}


def _changed(old: DependencyState | None, error: str, wall: float, mono: float) -> DependencyState:
    """The state after a check that found ``error`` ("" for none); ``since`` only moves on a
    change between ok and not ok (a new error message on a failing dependency is no change)."""
    ok = not error
    if old is not None and old.ok == ok:
        old.error = error
        return old
    return DependencyState(ok, error, wall, mono)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


class ReadinessChecker:
    """Checks Postgres and the shards in the background; see the module docstring."""

    def __init__(
        self,
        engine: AsyncEngine,
        shard_map: Callable[[], ShardMap],
        pool: ShardPool,
        *,
        postgres_grace_s: float,
        interval_s: float = DEFAULT_INTERVAL_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._engine = engine
        self._shard_map = shard_map
        self._pool = pool
        #: Postgres may be unreachable this long before the coordinator is not ready, in s.
        self.postgres_grace_s = postgres_grace_s
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.postgres: DependencyState | None = None
        self.shards: dict[int, DependencyState] = {}
        self.ready = True
        self.reason = ""
        self._listeners: list[Callable[[bool], Awaitable[None]]] = []
        self._task: asyncio.Task[None] | None = None
        #: A Postgres check that has not answered yet (it is not started twice).
        self._pg_check: asyncio.Task[None] | None = None

    def on_change(self, listener: Callable[[bool], Awaitable[None]]) -> None:
        """``listener(ready)`` is awaited whenever readiness changes."""
        self._listeners.append(listener)

    async def start(self) -> None:
        """One round now (so the first answer is a real one), then one every ``interval_s``."""
        await self.check_once()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._pg_check is not None and not self._pg_check.done():
            # Left to finish (a cancelled pool checkout can lose its connection), within bounds.
            await asyncio.wait({self._pg_check}, timeout=5)
            self._pg_check.cancel()
            await asyncio.gather(self._pg_check, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check_once()
            except Exception:  # a bug of ours must not end the checks and freeze the answer
                log.exception("readiness check failed")

    async def check_once(self) -> None:
        """Check every dependency at once, then decide readiness (and tell the listeners)."""
        smap = self._shard_map()
        clients = self._pool.all()
        ids = sorted(smap.shards)
        errors = await asyncio.gather(
            self._check_postgres(), *(self._check_shard(clients.get(sid)) for sid in ids)
        )
        wall, mono = time.time(), time.monotonic()
        self._note("postgres", self.postgres, errors[0])
        self.postgres = _changed(self.postgres, errors[0], wall, mono)
        shards = {}
        for sid, error in zip(ids, errors[1:], strict=True):
            self._note(f"shard {sid}", self.shards.get(sid), error)
            shards[sid] = _changed(self.shards.get(sid), error, wall, mono)
        self.shards = shards
        ready, reason = self._decide(mono)
        if ready != self.ready:
            log.warning("not ready: %s", reason) if not ready else log.info("ready again")
            self.ready, self.reason = ready, reason
            for listener in self._listeners:
                await listener(ready)
        self.reason = reason

    def _decide(self, mono: float) -> tuple[bool, str]:
        if self.shards and not any(s.ok for s in self.shards.values()):
            return False, "every shard of the map is unreachable"
        pg = self.postgres
        if pg is not None and not pg.ok and mono - pg.since_mono_s > self.postgres_grace_s:
            return False, (
                f"Postgres unreachable for more than {self.postgres_grace_s:g}s "
                "(--token-stale-max-s): no cached token may be used any more"
            )
        return True, ""

    @staticmethod
    def _note(name: str, old: DependencyState | None, error: str) -> None:
        if error and (old is None or old.ok):
            log.warning("%s is unreachable: %s", name, error)
        elif not error and old is not None and not old.ok:
            log.info("%s answers again", name)

    async def _check_postgres(self) -> str:
        if self._pg_check is None or self._pg_check.done():
            self._pg_check = asyncio.get_running_loop().create_task(self._select_one())
        try:
            async with asyncio.timeout(self.timeout_s):
                # shield: the query goes on past the timeout rather than be cancelled inside
                # the pool (see shardq.store.db.Uncancellable); the next round waits for it.
                await asyncio.shield(self._pg_check)
        except TimeoutError:
            return f"no answer within {self.timeout_s:g}s"
        except Exception as exc:
            return _describe(exc)
        return ""

    async def _select_one(self) -> None:
        async with self._engine.connect() as conn:
            await conn.execute(sa.text("SELECT 1"))

    async def _check_shard(self, client: Any) -> str:
        if client is None:
            return "no client for this shard yet"
        try:
            async with asyncio.timeout(self.timeout_s):
                await client.redis.ping()
        except TimeoutError:
            return f"no answer within {self.timeout_s:g}s"
        except Exception as exc:
            return _describe(exc)
        return ""

    def report(self) -> tuple[bool, dict[str, Any]]:
        """``/readyz``: ready or not, why not, and each dependency's state."""
        smap = self._shard_map()
        return self.ready, {
            "ready": self.ready,
            "reason": self.reason,
            "map_version": smap.version,
            "postgres": {
                **(self.postgres.as_json() if self.postgres else {"ok": None, "error": ""}),
                "not_ready_after_s": self.postgres_grace_s,
            },
            "shards": [
                {
                    "id": sid,
                    "address": smap.shards[sid].address if sid in smap.shards else "",
                    **state.as_json(),
                }
                for sid, state in sorted(self.shards.items())
            ],
        }
