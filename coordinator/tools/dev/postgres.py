"""The Postgres of ``shardq dev`` when no ``--database-url`` is given: the server shipped by
the ``pgserver`` wheel (PostgreSQL 16 binaries), its data in ``<data-dir>/postgres``."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg

from shardq.coordinator.tools.dev.processes import DevError, port_is_free, tail
from shardq.coordinator.tools.redis_server import free_port, parent_death_prefix


class EmbeddedPostgres:
    """PostgreSQL from the ``pgserver`` wheel, run as a child process (not daemonized by
    ``pg_ctl``), so it stops with ``shardq dev`` and dies with it. Under root it runs as the
    ``pgserver`` system user, which pgserver creates; it listens on 127.0.0.1 only.
    ``settings`` are server settings (``{"fsync": "off"}``: the tests' throwaway server)."""

    def __init__(self, pgdata: Path, log: Path, settings: Mapping[str, str] | None = None) -> None:
        self.pgdata = pgdata
        self.log = log
        self.settings = dict(settings or {})
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self, timeout_s: float = 60.0) -> str:
        try:
            # Untyped helpers of the wheel: where its binaries are, initdb, the system user.
            with warnings.catch_warnings():  # platformdirs: "XDG_RUNTIME_DIR is not set"
                warnings.simplefilter("ignore")
                _commands: Any = importlib.import_module("pgserver._commands")
                utils: Any = importlib.import_module("pgserver.utils")
        except ImportError as exc:
            raise DevError(
                f"no embedded Postgres ({exc}): `pip install pgserver`, or pass --database-url"
            ) from exc
        bin_path: Path = _commands.POSTGRES_BIN_PATH
        user = None
        self.pgdata.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:  # postgres refuses to run as root
            user = "pgserver"
            entry = utils.ensure_user_exists(user)
            utils.ensure_prefix_permissions(self.pgdata)
            utils.ensure_prefix_permissions(bin_path)
            utils.ensure_folder_permissions(bin_path, 0o055)
            utils.ensure_folder_permissions(bin_path.parent / "lib", 0o044)
            os.chown(self.pgdata, entry.pw_uid, entry.pw_gid)
        if not (self.pgdata / "PG_VERSION").exists():
            _commands.initdb(
                ["--auth=trust", "--encoding=utf8", "--no-sync", "-U", "postgres"],
                pgdata=self.pgdata,
                user=user,
            )
        # The caller's port while it is free (shardq dev keeps one across restarts), else any.
        self.port = self.port if self.port and port_is_free(self.port) else free_port()
        with open(self.log, "ab") as log:
            log.write(f"--- shardq dev: postgres on port {self.port}\n".encode())
            log.flush()
            # No Unix socket (-k ""): the data dir's path may be too long for one.
            argv = [str(bin_path / "postgres"), "-D", str(self.pgdata), "-h", "127.0.0.1"]
            argv += [a for k, v in self.settings.items() for a in ("-c", f"{k}={v}")]
            self.proc = subprocess.Popen(
                [*parent_death_prefix(), *argv, "-p", str(self.port), "-k", ""],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                user=user,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DevError(
                    f"postgres exited with {self.proc.returncode}; its log {self.log}:\n"
                    + tail(self.log)
                )
            try:
                with psycopg.connect(self.url, connect_timeout=1):
                    return self.url
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise DevError(f"postgres did not answer within {timeout_s:.0f}s; see {self.log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown: clients are gone by now
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
