"""Logins kept server side: the browser holds only a random session ID in an HttpOnly,
SameSite=Strict cookie (Secure over TLS); the token stays in this process's memory and is
never put in a URL, a page or a log line. A restart logs everyone out.

Each session has its own CSRF token, which every form of its pages carries and every POST
must send back (compared in constant time).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field

#: A session unused this long is forgotten (seconds).
IDLE_S = 12 * 3600
#: Most sessions kept at once; the least recently used goes first beyond it, so a flood of
#: logins cannot grow the process without bound.
MAX_SESSIONS = 10_000


@dataclass(slots=True)
class Session:
    #: Out of the repr: a logged or printed session must not show it.
    token: str = field(repr=False)
    #: "admin" or "tenant".
    role: str
    #: The token's tenant ("" for the admin token).
    tenant: str
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)
    last_seen: float = field(default_factory=time.monotonic)

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
    def __init__(self, idle_s: float = IDLE_S, max_sessions: int = MAX_SESSIONS) -> None:
        self.idle_s = idle_s
        self.max_sessions = max_sessions
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
            oldest = min(self._sessions, key=lambda k: self._sessions[k].last_seen)
            del self._sessions[oldest]
        session_id = secrets.token_urlsafe(32)
        self._sessions[self._key(session_id)] = session
        return session_id

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        key = self._key(session_id)
        session = self._sessions.get(key)
        if session is None:
            return None
        now = time.monotonic()
        if now - session.last_seen > self.idle_s:
            del self._sessions[key]
            return None
        session.last_seen = now
        return session

    def drop(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(self._key(session_id), None)

    def an_admin(self) -> Session | None:
        """The most recently seen admin session, whose token the chart sampler borrows."""
        self._expire()
        admins = [s for s in self._sessions.values() if s.is_admin]
        return max(admins, key=lambda s: s.last_seen) if admins else None

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, s in self._sessions.items() if now - s.last_seen > self.idle_s]:
            del self._sessions[key]


def same(a: str, b: str) -> bool:
    """Constant-time comparison of two CSRF tokens."""
    return bool(a) and secrets.compare_digest(a.encode(), b.encode())
