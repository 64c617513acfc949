"""Logins kept server side: the browser holds only a random session ID in an HttpOnly,
SameSite=Strict cookie (Secure over TLS, or behind a TLS proxy the dashboard trusts); the token
stays in this process's memory and is never put in a URL, a page or a log line. A restart logs
everyone out.

A session ends at the first of: logout, ``idle_s`` without a request, ``max_age_s`` after the
login whatever the activity (an overview left open polls every few seconds, so the idle limit
alone would keep it logged in for ever), the API refusing its token, or eviction when
``max_sessions`` are open. Its end sets :attr:`Session.ended`, which every live stream opened
under it (a job page's WatchJob events) waits on, so none outlives it.

Why server side rather than a signed, encrypted cookie that any replica could read: a logout
or an expiry here ends the session for good, and its streams with it; a cookie that carries
the token stays valid wherever a copy of it is until it expires, since the dashboard, a pure
client of the API, has no shared place to keep a list of revoked cookies. Several replicas
therefore need session affinity (the chart sets it); see docs/dashboard.md.

Each session has its own CSRF token, which every form of its pages carries and every POST
must send back (compared in constant time).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: A session without a request for this long ends (seconds).
IDLE_S = 3600.0
#: A session ends this long after its login, however active (seconds).
MAX_AGE_S = 12 * 3600.0
#: Most sessions kept at once; the least recently used goes first beyond it, so a flood of
#: logins cannot grow the process without bound.
MAX_SESSIONS = 10_000

Clock = Callable[[], float]


@dataclass(slots=True)
class Session:
    #: Out of the repr: a logged or printed session must not show it.
    token: str = field(repr=False)
    #: "admin" or "tenant".
    role: str
    #: The token's tenant ("" for the admin token).
    tenant: str
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)
    #: The store's clock at login and at the latest request (set by the store).
    created: float = 0.0
    last_seen: float = 0.0
    #: Set once the session has ended (logout, expiry, eviction, token refused).
    ended: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def who(self) -> str:
        """How the log names this user: the role and tenant, never the token."""
        return "admin" if self.is_admin else f"tenant:{self.tenant}"

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),)


class SessionStore:
    def __init__(
        self,
        idle_s: float = IDLE_S,
        max_age_s: float = MAX_AGE_S,
        max_sessions: int = MAX_SESSIONS,
        clock: Clock = time.monotonic,
    ) -> None:
        if not (idle_s > 0 and max_age_s > 0):
            raise ValueError("session idle timeout and lifetime must be positive")
        self.idle_s = idle_s
        self.max_age_s = max_age_s
        self.max_sessions = max_sessions
        self.clock = clock
        # Keyed by a hash of the cookie value: a memory dump or a debugger shows no live
        # cookie.
        self._sessions: dict[str, Session] = {}

    @staticmethod
    def _key(session_id: str) -> str:
        return hashlib.sha256(session_id.encode()).hexdigest()

    def create(self, session: Session) -> str:
        """Store ``session``; returns the new session ID for the cookie."""
        self._expire()
        while len(self._sessions) >= self.max_sessions:
            self._end(min(self._sessions, key=lambda k: self._sessions[k].last_seen))
        session.created = session.last_seen = self.clock()
        session_id = secrets.token_urlsafe(32)
        self._sessions[self._key(session_id)] = session
        return session_id

    def deadline(self, session: Session) -> float:
        """When ``session`` ends unless a request comes first (the store's clock)."""
        return min(session.last_seen + self.idle_s, session.created + self.max_age_s)

    def alive(self, session: Session) -> bool:
        """Whether ``session`` is still open; ends it (setting ``ended``) when its time is up."""
        if session.ended.is_set():
            return False
        if self.clock() < self.deadline(session):
            return True
        for key, s in list(self._sessions.items()):
            if s is session:
                self._end(key)
        session.ended.set()
        return False

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        key = self._key(session_id)
        session = self._sessions.get(key)
        if session is None:
            return None
        now = self.clock()
        if now >= self.deadline(session):
            self._end(key)
            return None
        session.last_seen = now
        return session

    def drop(self, session_id: str | None) -> None:
        """End the session of this cookie value (logout, token refused): its streams close."""
        if session_id:
            self._end(self._key(session_id))

    def an_admin(self) -> Session | None:
        """The most recently seen admin session, whose token the chart sampler borrows."""
        self._expire()
        admins = [s for s in self._sessions.values() if s.is_admin]
        return max(admins, key=lambda s: s.last_seen) if admins else None

    def _end(self, key: str) -> None:
        session = self._sessions.pop(key, None)
        if session is not None:
            session.ended.set()

    def _expire(self) -> None:
        now = self.clock()
        for key in [k for k, s in self._sessions.items() if now >= self.deadline(s)]:
            self._end(key)


def same(a: str, b: str) -> bool:
    """Constant-time comparison of two CSRF tokens."""
    return bool(a) and secrets.compare_digest(a.encode(), b.encode())
