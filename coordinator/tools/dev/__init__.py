"""``shardq dev``: a whole shardq cluster on this machine, in one command, until Ctrl-C.

It starts, as real processes of its own (each under ``setpriv --pdeathsig``, its own ``SHARDQ_*``
environment and a log file under ``<data-dir>/logs``):

- ``--shards`` ``redis-server`` processes with AOF on, data in ``<data-dir>/redis-<i>``, on
  ports ``--redis-base-port + i`` (fixed, so a restart finds the addresses of the shard map);
- Postgres: ``--database-url`` when given, else the server shipped by the ``pgserver`` wheel
  with its data in ``<data-dir>/postgres`` (run as the ``pgserver`` system user under root);
- the schema (``shardq migrate``), the shard map (``shardq shards sync``) and tokens, kept in
  ``<data-dir>/tokens.json`` so a restart reuses them;
- one coordinator (``python -m shardq.coordinator.server``), one shard loop per shard
  (``python -m shardq.shard``) and ``--workers`` workers (``python -m shardq.worker``) on the
  example handlers (``shardq.worker.examples``) or ``--handlers``.

Once every process answers it prints one line starting with ``shardq dev ready``, then how to
use the cluster, then a live view (or a status line every few seconds with ``--no-live`` or
when stdout is not a terminal). SIGINT, SIGTERM and SIGHUP stop everything it started, workers
first; ``<data-dir>/pids.json`` names every process while it runs.

Here: the command (its flags, start, watch, stop). ``cluster.py`` starts and stops the
processes (``processes.py``: one process; ``postgres.py``: the embedded Postgres),
``database.py`` prepares the schema, shard map and tokens, ``view.py`` prints.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from typing import IO

from shardq.common import config
from shardq.coordinator.tools.data_dir import default_data_dir
from shardq.coordinator.tools.dev.cluster import DevCluster
from shardq.coordinator.tools.dev.processes import DevError
from shardq.coordinator.tools.dev.view import READY_LINE, Workload, ready_text, watch

__all__ = ["DEFAULT_HANDLERS", "READY_LINE", "DevError", "Workload", "add_arguments", "run"]

DEFAULT_HANDLERS = "shardq.worker.examples"
#: ``shardq dev`` flags default to ``SHARDQ_DEV_<FLAG>`` (not the components' variables:
#: ``SHARDQ_SHARDS`` already means a worker's static shards).
ENV_PREFIX = "SHARDQ_DEV_"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``shardq dev``'s arguments (the CLI registers them)."""

    def opt(flag: str, default: object, help: str, kind: Callable[[str], object] = str) -> None:
        config.add(parser, flag, default, help, kind, env_prefix=ENV_PREFIX)

    opt("--shards", 2, "Redis shards to run", int)
    opt("--workers", 2, "worker processes", int)
    opt("--port", 50051, "the coordinator's gRPC port on 127.0.0.1", int)
    opt("--data-dir", str(default_data_dir()), "working folder: Redis AOF, Postgres, tokens, logs")
    opt("--redis-base-port", 6390, "shard i's Redis listens on this port + i", int)
    opt(
        "--dashboard-port",
        8080,
        "the web dashboard's port on 127.0.0.1 (a free one when it is taken)",
        int,
    )
    parser.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    config.add_database_url(
        parser,
        "Postgres to use (empty: an embedded pgserver in the data dir)",
        env_prefix=ENV_PREFIX,
    )
    parser.add_argument(
        "--token",
        action="append",
        default=[],
        metavar="TENANT=TOKEN",
        help="a tenant and its token (sq_<12 hex>_<43 chars>); repeatable "
        "(default: a generated token for tenant 'demo')",
    )
    opt("--admin-token", "", "the admin token to register (empty: a generated one)")
    opt("--handlers", DEFAULT_HANDLERS, "module(s) of the workers' handlers, comma-separated")
    config.add_key_prefix(parser, env_prefix=ENV_PREFIX)
    opt("--concurrency", 16, "handlers each worker runs at once", int)
    opt(
        "--process-pool-size",
        2,
        "processes each worker keeps for cpu_bound handlers (0: none, they fail)",
        int,
    )
    config.add_log_level(
        parser, "the processes' log level (their logs: <data-dir>/logs)", env_prefix=ENV_PREFIX
    )
    opt("--status-interval-s", 5.0, "seconds between status lines without the live view", float)
    parser.add_argument(
        "--no-live", action="store_true", help="status lines instead of the live view"
    )
    parser.add_argument(
        "--demo", action="store_true", help="submit the `shardq demo` workload once up"
    )


@contextlib.contextmanager
def _signals_set(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> Iterator[None]:
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for sig in sigs:
        loop.add_signal_handler(sig, event.set)
    try:
        yield
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)


async def run(args: argparse.Namespace, demo: Workload | None = None) -> int:
    """``shardq dev``: start, show progress until a signal, stop everything. ``demo`` is the
    workload ``--demo`` submits (the CLI passes ``shardq demo``'s)."""
    cluster = DevCluster(args)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    with _signals_set(loop, stopping):
        try:
            await cluster.start(stopping)
            if stopping.is_set():
                return 0
            print(ready_text(cluster), flush=True)
            await watch(cluster, stopping, demo)
        except DevError as exc:
            _say(f"shardq dev: error: {exc}", sys.stderr)
            return 1
        except OSError:
            # The terminal went away (SIGHUP): writing to it fails; stopping must not.
            if not stopping.is_set():
                raise
        finally:
            _say("shardq dev: stopping")
            cluster.stop()
            _say("shardq dev: stopped")
    return 0


def _say(text: str, stream: IO[str] | None = None) -> None:
    """Print, unless the terminal is gone: nothing must keep the cluster from stopping."""
    with contextlib.suppress(OSError, ValueError):
        print(text, file=stream or sys.stdout, flush=True)
