"""The console scripts of ``pyproject.toml`` (``[project.scripts]``): each program's module is
imported with the garbage collector paused, then what the imports made is frozen.

Importing a server makes ~100k objects (modules, their functions and tables) that live as
long as the process. With the collector on, the allocations trip collection after collection
on the way, the full ones walking everything made so far: a third of a start
(``shardq-worker --help`` 0.75 → 0.49 s, ``shardq migrate --help`` 0.62 → 0.39 s on the
2-core bench machine; docs/benchmarks.md, session 31). Frozen (``gc.freeze``), they are left
out of every later collection as well, as ``config.freeze_startup_heap`` does for the rest of
a server's start.

Here, in the namespace's root, because no room may import the others: each function imports
its program only when it is run. ``shardq`` (the CLI) imports its command's modules inside
``main``, which resumes the collector once it has them. ``python -m shardq._programs MODULE
[ARG ...]`` runs a server as ``python -m MODULE`` would, the same way, for what starts them by
module rather than by script (``shardq dev``, ``shardq-coordinator --processes``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import cast

from shardq.common import config


def shardq() -> int:
    config.pause_gc_for_imports()
    from shardq.coordinator.cli import main  # noqa: PLC0415 - after the pause

    return main()


def _run(module: str) -> object:
    """``module``'s ``main()``, the module imported with the collector paused."""
    config.pause_gc_for_imports()
    main = importlib.import_module(module).main
    config.resume_gc_after_imports()
    return main()


def coordinator() -> None:
    _run("shardq.coordinator.server")


def shard() -> None:
    _run("shardq.shard.__main__")


def worker() -> None:
    _run("shardq.worker.__main__")


def dashboard() -> int:
    return cast(int, _run("shardq.coordinator.dashboard.server"))  # its main's exit code


#: The servers' modules (what ``python -m`` names) and the function that runs each.
BY_MODULE: dict[str, Callable[[], object]] = {
    "shardq.coordinator.server": coordinator,
    "shardq.coordinator.dashboard": dashboard,
    "shardq.shard": shard,
    "shardq.worker": worker,
}


def run_module(argv: list[str]) -> None:
    """``python -m shardq._programs MODULE [ARG ...]``: the server ``MODULE`` with ``ARG``s,
    its program name (``sys.argv[0]``) its module's, as under ``python -m MODULE``."""
    if len(argv) < 2 or argv[1] not in BY_MODULE:
        raise SystemExit(f"usage: python -m shardq._programs {{{','.join(BY_MODULE)}}} [ARG ...]")
    sys.argv = [argv[1], *argv[2:]]
    status = BY_MODULE[argv[1]]()
    if status:  # the dashboard's exit code (the servers return nothing: they raise to fail)
        raise SystemExit(status)


if __name__ == "__main__":
    run_module(sys.argv)
