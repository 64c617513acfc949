"""The handler API users write against.

    from shardq.worker import handler

    @handler("email.send", timeout_s=30, max_attempts=5)
    async def send(ctx, payload: dict) -> dict: ...

``async def`` handlers run on the worker's event loop; plain functions run in a thread pool;
``cpu_bound=True`` runs them in a process pool (they must be importable module-level
functions, and get a context without a database session).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Mode = Literal["async", "thread", "process"]


class RetryLater(Exception):
    """Raise from a handler to try again after ``delay_s`` (counts as an attempt)."""

    def __init__(self, delay_s: float, reason: str = "retry requested") -> None:
        super().__init__(reason)
        self.delay_s = delay_s


class PermanentFailure(Exception):
    """Raise from a handler to send the job to the dead-letter set without more attempts."""


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    name: str
    fn: Callable[..., Any]
    mode: Mode
    #: Per-attempt time limit; None takes the job's own timeout_ms.
    timeout_s: float | None = None
    #: Attempts this handler allows at most; None takes the job's own max_attempts.
    max_attempts: int | None = None


#: Handlers registered by @handler in this process, by name.
REGISTRY: dict[str, HandlerSpec] = {}


def handler(
    name: str,
    *,
    timeout_s: float | None = None,
    max_attempts: int | None = None,
    cpu_bound: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in REGISTRY and REGISTRY[name].fn is not fn:
            raise ValueError(f"handler {name!r} is registered twice")
        if cpu_bound and inspect.iscoroutinefunction(fn):
            raise ValueError(f"handler {name!r}: a cpu_bound handler must be a plain function")
        mode: Mode = (
            "process" if cpu_bound else "async" if inspect.iscoroutinefunction(fn) else "thread"
        )
        REGISTRY[name] = HandlerSpec(name, fn, mode, timeout_s, max_attempts)
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
