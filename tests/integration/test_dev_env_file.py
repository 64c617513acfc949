"""``shardq dev`` keeps one Postgres port across restarts and says where it is: the
embedded Postgres's port is stored in the data dir and reused while free (a new one, and a
rewritten ``shardq.env``, when it is taken), and the ``shardq`` command next to it needs no
flag (``shardq tokens list`` reads the database URL from ``shardq.env``)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardq.common import config
from tests.support import docs


@pytest.fixture
def home() -> Iterator[Path]:
    # Outside pytest's basetemp, which each pytest session resets to 0700: the embedded
    # Postgres runs as the `pgserver` user.
    path = Path(tempfile.mkdtemp(prefix="shardq-devenv-home-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start(home: Path, port: int, base: int) -> docs.DevProcess:
    dev = docs.DevProcess(home, port, base)
    try:
        dev.wait_ready()
    except BaseException:
        dev.stop()
        raise
    return dev


def tokens_list(dev: docs.DevProcess) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(docs.VENV_BIN / "shardq"), "tokens", "list"],
        env=dev.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.timeout(600)
def test_postgres_keeps_its_port_across_restarts_and_moves_when_it_is_taken(home: Path) -> None:
    dev = start(home, 0, 0)
    port, base = dev.port, dev.redis_base_port
    try:
        url = config.read_env_file(dev.env_file)["SHARDQ_DATABASE_URL"]
        assert dev.env_file.stat().st_mode & 0o077 == 0  # it holds tokens
        assert tokens_list(dev).returncode == 0
    finally:
        dev.stop()
    # A stopped cluster's settings would send the next `shardq` call to closed ports.
    assert not dev.env_file.exists()
    pg_port = int((dev.env_file.parent / "postgres.port").read_text())
    assert url == f"postgresql://postgres@127.0.0.1:{pg_port}/postgres"

    dev = start(home, port, base)
    try:
        assert config.read_env_file(dev.env_file)["SHARDQ_DATABASE_URL"] == url
        listed = tokens_list(dev)
        assert listed.returncode == 0, listed.stderr
        assert "shardq dev" in listed.stdout
    finally:
        dev.stop()

    with socket.socket() as squatter:  # someone else took the port meanwhile
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
        squatter.bind(("127.0.0.1", pg_port))
        squatter.listen()
        dev = start(home, port, base)
        try:
            moved = config.read_env_file(dev.env_file)["SHARDQ_DATABASE_URL"]
            assert moved != url
            assert int((dev.env_file.parent / "postgres.port").read_text()) != pg_port
            listed = tokens_list(dev)
            assert listed.returncode == 0, listed.stderr
        finally:
            dev.stop()
