"""Bearer tokens: created once, stored only as a sha256, checked on every call from a cache.

A token reads ``sq_<token_id>_<secret>``: ``token_id`` (12 hex chars) is public and names the
token in lists, logs and ``revoke``; the secret is 32 random bytes. The database keeps the
sha256 of the whole token, never the token. A plain unsalted hash is enough here (unlike
passwords): 256 bits of randomness cannot be guessed from its hash.

:meth:`TokenStore.authenticate` is on every request's path, so it answers from an in-process
cache (token hash → principal, negative answers too) for ``cache_ttl_s``. The price: a token
revoked in another process keeps working there for up to ``cache_ttl_s`` (5 s by default);
in the revoking process it stops at once.

**While Postgres cannot be reached** the front door keeps working for the tokens it knows:
an answer past ``cache_ttl_s`` whose refresh fails (the database is down, refuses
connections, or does not answer within ``lookup_timeout_s``) is served as it was last read,
for up to ``stale_max_s`` after that read (15 min by default). Then:

- a negative answer stays negative: a stale answer is served as it was, never upgraded;
- a token this process has not seen before gets ``Unavailable``, not "invalid" (why: see
  :meth:`TokenStore.authenticate`);
- past ``stale_max_s`` no cached answer is used: every call is ``Unavailable`` until the
  database answers again;
- the database is not asked on every call meanwhile: after a failed lookup no lookup at all
  is made for ``retry_s`` (one probe per interval for the whole process, however many
  tokens and calls); a token has at most one lookup in flight, and while it runs (or hangs)
  other calls with that token are answered from the cache without waiting for it;
- the first successful lookup after the outage replaces the entry, so a token revoked during
  the outage stops working within ``retry_s`` of the database being back (plus the usual
  ``cache_ttl_s`` on replicas that refreshed it just before).
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import psycopg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from shardq.common import validation
from shardq.common.errors import InvalidArgument, Unavailable
from shardq.store import db

log = logging.getLogger("shardq.coordinator.tokens")

ROLES = db.TOKEN_ROLES
TOKEN_PREFIX = "sq_"
# token_urlsafe(32) is 43 characters of [A-Za-z0-9_-].
TOKEN_RE = re.compile(r"sq_([0-9a-f]{12})_[A-Za-z0-9_-]{43}")
#: Most cached answers; the oldest are dropped beyond it (bounds memory under junk tokens).
CACHE_MAX_ENTRIES = 10_000

#: Default of ``TokenStore.stale_max_s``: how long after its last successful read a cached
#: answer may still be used while the database cannot be reached (``--token-stale-max-s``).
DEFAULT_STALE_MAX_S = 900.0
#: Default of ``TokenStore.retry_s``: after a failed lookup, no lookup for this long.
DEFAULT_RETRY_S = 1.0
#: Default of ``TokenStore.lookup_timeout_s``: a lookup not answered by then counts as failed
#: (a partitioned database can leave a connection attempt hanging for minutes).
DEFAULT_LOOKUP_TIMEOUT_S = 2.0

#: What a lookup raises when the database cannot be reached (rather than a bug of ours):
#: SQLAlchemy's wrappers of connection errors, its pool timeout, psycopg's own, sockets and
#: timeouts (TimeoutError is an OSError).
UNREACHABLE: tuple[type[BaseException], ...] = (
    sa.exc.OperationalError,
    sa.exc.InterfaceError,
    sa.exc.TimeoutError,
    psycopg.OperationalError,
    OSError,
)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts as: ``role`` is tenant, admin or worker; tenant tokens name a tenant."""

    role: str
    tenant_id: str | None
    token_id: str


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token as ``tokens list`` shows it: everything except the secret and its hash."""

    token_id: str
    role: str
    tenant_id: str | None
    name: str
    created_at: datetime
    revoked_at: datetime | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(slots=True)
class _Entry:
    """A cached answer of the database for one token hash."""

    #: Who the token stands for; None for an unknown or revoked token.
    principal: Principal | None
    #: When the database gave this answer (the store's clock).
    read_at: float
    #: No lookup for this token before then: ``read_at + cache_ttl_s``, or later after a
    #: failed refresh.
    next_lookup_at: float


def well_formed(token: object) -> bool:
    """Whether ``token`` is spelled as a token (``sq_<id>_<secret>``); others need no lookup."""
    return isinstance(token, str) and TOKEN_RE.fullmatch(token) is not None


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        cache_ttl_s: float = 5.0,
        stale_max_s: float = DEFAULT_STALE_MAX_S,
        retry_s: float = DEFAULT_RETRY_S,
        lookup_timeout_s: float = DEFAULT_LOOKUP_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        #: How long an answer of ``authenticate`` is reused, in seconds (the revocation delay).
        self.cache_ttl_s = cache_ttl_s
        #: How long after its last read an answer may still be used while the database
        #: cannot be reached, in seconds; 0 (or less than ``cache_ttl_s``): never past the TTL.
        self.stale_max_s = stale_max_s
        #: After a failed lookup, how long no lookup is made (stale answers are served), in s.
        self.retry_s = retry_s
        #: A lookup not answered within this many seconds counts as failed.
        self.lookup_timeout_s = lookup_timeout_s
        self._clock = clock
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        #: No lookup before this time (the store's clock): set by a failed lookup.
        self._quiet_until = float("-inf")
        #: The database could not be reached at the last lookup (for logging the outage once).
        self._failing = False
        #: Lookups in flight, by token hash: concurrent calls for one token share one.
        self._inflight: dict[str, asyncio.Task[Principal | None]] = {}
        #: Bumped by ``revoke``: a lookup that started before a revocation is not cached.
        self._revocations = 0
        #: Database lookups tried, and answers served past the TTL because a lookup failed.
        self.lookups = 0
        self.stale_answers = 0

    async def create(
        self, role: str, tenant_id: str | None = None, name: str = "", token: str | None = None
    ) -> tuple[str, str]:
        """A new token as ``(token_id, token)``; the token is shown now and never again.

        ``token`` registers a given token instead of generating one (``shardq dev --token``):
        it must have the generated form, ``sq_<12 hex>_<43 of [A-Za-z0-9_-]>``, and is stored
        the same way, as its sha256 under the ID it carries.
        """
        if role not in ROLES:
            raise InvalidArgument(f"{role!r} is not one of {', '.join(ROLES)}", field="role")
        if role == "tenant":
            if tenant_id is None:
                raise InvalidArgument("a tenant token needs a tenant", field="tenant_id")
            validation.tenant_id(tenant_id)
        elif tenant_id is not None:
            raise InvalidArgument(f"an {role} token has no tenant", field="tenant_id")
        if token is None:
            token_id = secrets.token_hex(6)
            token = f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
        else:
            match = TOKEN_RE.fullmatch(token)
            if match is None:
                raise InvalidArgument(
                    "a token reads sq_<12 hex chars>_<43 chars of A-Za-z0-9_->", field="token"
                )
            token_id = match.group(1)
        async with self._engine.begin() as conn:
            await conn.execute(
                sa.insert(db.tokens).values(
                    token_id=token_id,
                    token_hash=hash_token(token),
                    role=role,
                    tenant_id=tenant_id,
                    name=name,
                )
            )
        return token_id, token

    async def revoke(self, token_id: str) -> bool:
        """Revoke a token; False when there is no such token or it was revoked already."""
        async with self._engine.begin() as conn:
            result = await conn.execute(
                sa.update(db.tokens)
                .where(db.tokens.c.token_id == token_id, db.tokens.c.revoked_at.is_(None))
                .values(revoked_at=sa.func.now())
            )
        # This process stops accepting it at once; others within cache_ttl_s.
        self._revocations += 1
        for key, entry in list(self._cache.items()):
            if entry.principal is not None and entry.principal.token_id == token_id:
                del self._cache[key]
        return bool(result.rowcount)

    async def list(self, include_revoked: bool = True) -> builtins.list[TokenInfo]:
        """Every token, oldest first, without secrets or hashes."""
        t = db.tokens
        query = sa.select(
            t.c.token_id, t.c.role, t.c.tenant_id, t.c.name, t.c.created_at, t.c.revoked_at
        ).order_by(t.c.created_at, t.c.token_id)
        if not include_revoked:
            query = query.where(t.c.revoked_at.is_(None))
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [
            TokenInfo(r.token_id, r.role, r.tenant_id, r.name, r.created_at, r.revoked_at)
            for r in rows
        ]

    async def authenticate(self, token: str) -> Principal | None:
        """The principal ``token`` stands for, or None for an unknown, revoked or malformed one.

        Malformed tokens are turned away without a query; others are looked up by hash at
        most once per ``cache_ttl_s``. While the database cannot be reached, the last answer
        read for the token is used for up to ``stale_max_s`` after that read (see the module
        docstring); without one, :class:`Unavailable` is raised.

        Why Unavailable and not None (UNAUTHENTICATED) for a token never seen here: we do not
        know that it is invalid, only that we cannot check it. Most such tokens are valid ones
        this replica has not been shown yet (a service just deployed, a replica just
        started). UNAUTHENTICATED is a final answer: clients do not retry it, and operators
        act on it (rotate credentials, page someone); UNAVAILABLE is the truth, is retried by
        every client, and succeeds once the database is back. A forged token gains nothing
        from it: it is refused either way, and causes no database lookup during the outage.
        """
        match = TOKEN_RE.fullmatch(token) if isinstance(token, str) else None
        if match is None:
            return None
        digest = hash_token(token)
        now = self._clock()
        entry = self._cache.get(digest)
        if (
            entry is not None
            and now < entry.next_lookup_at
            and now - entry.read_at < self.cache_ttl_s
        ):
            return entry.principal  # the common case: fresh
        if not self._should_look_up(entry, digest, now):
            return self._serve_stale(entry, now)
        try:
            return await self._refresh(digest, match.group(1))
        except UNREACHABLE as exc:
            now = self._clock()
            self._lookup_failed(now, exc)
            entry = self._cache.get(digest)
            if entry is not None:
                entry.next_lookup_at = now + self.retry_s
            return self._serve_stale(entry, now)

    def known(self, token: str) -> bool:
        """Whether ``token`` is one the gate need not throttle: ``authenticate`` refuses it
        without a lookup (malformed), answers it from the cache (fresh) or from a lookup
        already under way, or last read it as valid (a refresh of a token seen valid is not a
        guess)."""
        if not well_formed(token):
            return True
        digest = hash_token(token)
        if digest in self._inflight:
            return True  # its one lookup is under way: this call shares it, at no cost
        entry = self._cache.get(digest)
        if entry is None:
            return False
        now = self._clock()
        fresh = now < entry.next_lookup_at and now - entry.read_at < self.cache_ttl_s
        return fresh or entry.principal is not None

    def _should_look_up(self, entry: _Entry | None, digest: str, now: float) -> bool:
        """Whether to ask the database now, rather than answer from the cache (or not at all)."""
        if entry is not None and now < entry.next_lookup_at:
            return False  # its refresh failed a moment ago
        if now < self._quiet_until:
            return False  # a lookup failed a moment ago: do not ask
        # Its lookup is under way (or hangs): answer from the cache rather than queue behind
        # it; only the call that started it waits for it, at most lookup_timeout_s.
        return entry is None or digest not in self._inflight or not self._usable(entry, now)

    def _usable(self, entry: _Entry, now: float) -> bool:
        """Whether ``entry`` may still be used past its TTL (read within ``stale_max_s``)."""
        return now - entry.read_at <= max(self.stale_max_s, self.cache_ttl_s)

    def _serve_stale(self, entry: _Entry | None, now: float) -> Principal | None:
        """The answer the database cannot refresh now, if one was read within stale_max_s."""
        if entry is None:
            raise Unavailable("the token cannot be checked: the database cannot be reached; retry")
        if not self._usable(entry, now):
            raise Unavailable(
                "the token cannot be checked: the database has been unreachable for longer "
                "than --token-stale-max-s allows serving it from cache; retry"
            )
        self.stale_answers += 1
        return entry.principal

    async def _refresh(self, digest: str, token_id: str) -> Principal | None:
        """The database's answer for the token, cached; one lookup per token at a time, each
        given at most ``lookup_timeout_s`` (it goes on in the background after that, and is
        cached if it then succeeds)."""
        task = self._inflight.get(digest)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._lookup_and_remember(digest, token_id)
            )
            self._inflight[digest] = task
            task.add_done_callback(lambda t: self._lookup_done(digest, t))
        try:
            async with asyncio.timeout(self.lookup_timeout_s):
                # shield: a caller that times out or goes away does not cancel the lookup
                # (SQLAlchemy's pool can lose a connection cancelled while it is set up).
                return await asyncio.shield(task)
        except TimeoutError:
            raise TimeoutError(
                f"no answer from the database within {self.lookup_timeout_s}s"
            ) from None

    async def _lookup_and_remember(self, digest: str, token_id: str) -> Principal | None:
        revocations = self._revocations
        self.lookups += 1
        principal = await self._lookup(digest, token_id)
        now = self._clock()
        if self._failing:
            self._failing = False
            log.info("token lookups answer again: the database is back")
        self._quiet_until = float("-inf")
        # A lookup that raced with a revocation in this process may have read the token as
        # still valid: answer it (as an earlier call would have been), but do not cache it.
        if revocations == self._revocations:
            self._remember(digest, now, principal)
        return principal

    async def _lookup(self, digest: str, token_id: str) -> Principal | None:
        t = db.tokens
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(
                    sa.select(t.c.token_id, t.c.role, t.c.tenant_id).where(
                        t.c.token_hash == digest, t.c.revoked_at.is_(None)
                    )
                )
            ).first()
        # The ID inside the token must be the one it was issued with.
        if row is None or row.token_id != token_id:
            return None
        return Principal(role=row.role, tenant_id=row.tenant_id, token_id=row.token_id)

    def _lookup_done(self, digest: str, task: asyncio.Task[Principal | None]) -> None:
        if self._inflight.get(digest) is task:
            del self._inflight[digest]
        if not task.cancelled():
            task.exception()  # retrieved: its callers may all have timed out and gone

    def _lookup_failed(self, now: float, exc: BaseException) -> None:
        self._quiet_until = max(self._quiet_until, now + self.retry_s)
        if not self._failing:
            self._failing = True
            log.warning(
                "token lookups fail (%s): serving tokens read in the last %.0fs from cache, "
                "refusing unseen ones UNAVAILABLE, one lookup per %.1fs until it answers",
                exc.__class__.__name__ if not str(exc) else str(exc).splitlines()[0],
                self.stale_max_s,
                self.retry_s,
            )

    def _remember(self, digest: str, read_at: float, principal: Principal | None) -> None:
        self._cache[digest] = _Entry(principal, read_at, read_at + self.cache_ttl_s)
        self._cache.move_to_end(digest)
        while len(self._cache) > CACHE_MAX_ENTRIES:
            self._cache.popitem(last=False)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait for lookups still running in the background (before the engine is disposed)."""
        pending = set(self._inflight.values())
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=timeout_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
