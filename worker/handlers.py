"""The handler API users write against.

    from shardq.worker import handler

    @handler("email.send", timeout_s=30, max_attempts=5,
             retry=Retry(base=1.0, max=60.0, jitter=0.5, permanent=(ValueError,)))
    async def send(ctx, payload: dict) -> dict: ...

``async def`` handlers run on the worker's event loop; plain functions run in a thread pool;
``cpu_bound=True`` runs them in a process pool (they must be importable module-level
functions, and get a context without a database session).
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from shardq.shard.backoff import MAX_WAIT_MS, Backoff

Mode = Literal["async", "thread", "process"]


class RetryLater(Exception):
    """Raise from a handler to try again after ``delay_s`` (counts as an attempt)."""

    def __init__(self, delay_s: float, reason: str = "retry requested") -> None:
        super().__init__(reason)
        self.delay_s = delay_s


class PermanentFailure(Exception):
    """Raise from a handler to send the job to the dead-letter set without more attempts."""


@dataclass(frozen=True, slots=True)
class Retry:
    """A handler's retry policy: the wait after attempt n failed is ``min(max, base * 2^(n-1))``
    seconds, of which the fraction ``jitter`` is random (1: anywhere from 0 to that wait).

    A field left None takes the server default (base 1 s, max 1 h, jitter 1); a job's own
    ``JobSpec.retry`` overrides this, field by field. An exception that is an instance of one
    of ``permanent`` sends the job to the dead-letter set at once, like
    :class:`PermanentFailure`.
    """

    #: Wait after the first failed attempt, in seconds (at least 0.001).
    base: float | None = None
    #: Longest wait, in seconds (at least ``base``).
    max: float | None = None
    #: Fraction of each wait drawn at random, from 0 to 1.
    jitter: float | None = None
    #: Exception types that dead-letter the job without more attempts.
    permanent: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        limit = MAX_WAIT_MS / 1000
        for name in ("base", "max"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and 0.001 <= value <= limit):
                raise ValueError(
                    f"Retry.{name} must be from 0.001 to {limit:g} seconds, not {value}"
                )
        if self.base is not None and self.max is not None and self.max < self.base:
            raise ValueError(f"Retry.max ({self.max}) is below Retry.base ({self.base})")
        if self.jitter is not None and not (math.isfinite(self.jitter) and 0 <= self.jitter <= 1):
            raise ValueError(f"Retry.jitter must be from 0 to 1, not {self.jitter}")
        if not isinstance(self.permanent, tuple) or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in self.permanent
        ):
            raise ValueError(
                f"Retry.permanent must be a tuple of exception types, not {self.permanent!r}"
            )

    def over(self, default: Backoff) -> Backoff:
        """This policy with the fields it leaves None taken from ``default``."""
        return Backoff(
            base_ms=default.base_ms if self.base is None else round(self.base * 1000),
            cap_ms=default.cap_ms if self.max is None else round(self.max * 1000),
            jitter=default.jitter if self.jitter is None else float(self.jitter),
        )


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    name: str
    fn: Callable[..., Any]
    mode: Mode
    #: Per-attempt time limit; None takes the job's own timeout_ms.
    timeout_s: float | None = None
    #: Attempts this handler allows at most; None takes the job's own max_attempts.
    max_attempts: int | None = None
    #: The handler's retry policy; None: the server default (a job's own policy wins).
    retry: Retry | None = None


#: Handlers registered by @handler in this process, by name.
REGISTRY: dict[str, HandlerSpec] = {}


def handler(
    name: str,
    *,
    timeout_s: float | None = None,
    max_attempts: int | None = None,
    cpu_bound: bool = False,
    retry: Retry | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in REGISTRY and REGISTRY[name].fn is not fn:
            raise ValueError(f"handler {name!r} is registered twice")
        if cpu_bound and inspect.iscoroutinefunction(fn):
            raise ValueError(f"handler {name!r}: a cpu_bound handler must be a plain function")
        mode: Mode = (
            "process" if cpu_bound else "async" if inspect.iscoroutinefunction(fn) else "thread"
        )
        if retry is not None and not isinstance(retry, Retry):
            raise ValueError(f"handler {name!r}: retry must be a Retry, not {retry!r}")
        REGISTRY[name] = HandlerSpec(name, fn, mode, timeout_s, max_attempts, retry)
        return fn

    return register


class HandlersNotFound(ImportError):
    """A ``--handlers`` module that is nowhere on the import path (not an import failing
    inside it: that one is the module's own bug and keeps its traceback)."""

    def __init__(self, module: str, missing: str, searched: list[str]) -> None:
        where = missing if missing == module else f"{missing} (for {module})"
        super().__init__(f"no module named {where}; searched: {', '.join(searched) or '(nothing)'}")
        self.module = module


def add_working_folder_to_path() -> None:
    """Put the current folder first on the import path, as celery, rq and arq workers do, so
    ``--handlers myapp.handlers`` run beside ``myapp/`` finds it (``shardq-worker``, a console
    script, would otherwise see only its own folder and site-packages)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def load(module_paths: str) -> dict[str, HandlerSpec]:
    """Import the comma-separated modules (their @handler calls register) and return all.

    Raises :class:`HandlersNotFound` when a module (or a package above it) does not exist;
    an ``ImportError`` raised while the module runs propagates unchanged."""
    for path in filter(None, (p.strip() for p in module_paths.split(","))):
        try:
            importlib.import_module(path)
        except ModuleNotFoundError as exc:
            # Missing is the module itself or a package above it: a bad --handlers. Anything
            # else (``import missing_dep`` inside the user's module) is theirs to see in full.
            parts = path.split(".")
            if exc.name not in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}:
                raise
            searched = [os.path.abspath(p or ".") for p in sys.path]
            raise HandlersNotFound(path, exc.name or path, searched) from None
    return dict(REGISTRY)
