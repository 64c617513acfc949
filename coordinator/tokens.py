"""Bearer tokens: created once, stored only as a sha256, checked on every call from a cache.

A token reads ``sq_<token_id>_<secret>``: ``token_id`` (12 hex chars) is public and names the
token in lists, logs and ``revoke``; the secret is 32 random bytes. The database keeps the
sha256 of the whole token, never the token. A plain unsalted hash is enough here (unlike
passwords): 256 bits of randomness cannot be guessed from its hash.

:meth:`TokenStore.authenticate` is on every request's path, so it answers from an in-process
cache (token hash → principal, negative answers too) for ``cache_ttl_s``. The price: a token
revoked in another process keeps working there for up to ``cache_ttl_s`` (5 s by default);
in the revoking process it stops at once.
"""

from __future__ import annotations

import builtins
import hashlib
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from shardq.common import validation
from shardq.common.errors import InvalidArgument
from shardq.store import db

ROLES = db.TOKEN_ROLES
TOKEN_PREFIX = "sq_"
# token_urlsafe(32) is 43 characters of [A-Za-z0-9_-].
TOKEN_RE = re.compile(r"sq_([0-9a-f]{12})_[A-Za-z0-9_-]{43}")
#: Most cached answers; the oldest are dropped beyond it (bounds memory under junk tokens).
CACHE_MAX_ENTRIES = 10_000


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


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        cache_ttl_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        #: How long an answer of ``authenticate`` is reused, in seconds (the revocation delay).
        self.cache_ttl_s = cache_ttl_s
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, Principal | None]] = OrderedDict()

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
        for key, (_, principal) in list(self._cache.items()):
            if principal is not None and principal.token_id == token_id:
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
        most once per ``cache_ttl_s``.
        """
        match = TOKEN_RE.fullmatch(token) if isinstance(token, str) else None
        if match is None:
            return None
        digest = hash_token(token)
        now = self._clock()
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        principal = await self._lookup(digest, match.group(1))
        self._remember(digest, now + self.cache_ttl_s, principal)
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

    def _remember(self, digest: str, expires_at: float, principal: Principal | None) -> None:
        self._cache[digest] = (expires_at, principal)
        self._cache.move_to_end(digest)
        while len(self._cache) > CACHE_MAX_ENTRIES:
            self._cache.popitem(last=False)
