"""A throwaway database per test on a real PostgreSQL.

The server is chosen once per test process, the first of these that works:

1. ``SHARDQ_TEST_DATABASE_URL`` when set. A configured server is never replaced silently: if
   it does not answer, every test that needs a database fails, saying so.
2. The machine's Postgres at ``SHARDQ_TEST_MACHINE_DATABASE_URL`` (default
   ``postgresql://postgres@127.0.0.1:5432/postgres``; set it empty to skip this step), when it
   answers.
3. A ``postgres:16`` container through testcontainers, where a Docker engine answers (asked
   first, which takes milliseconds where none runs).
4. PostgreSQL 16 from the ``pgserver`` wheel (a dependency of shardq, as for ``shardq dev``),
   in a temporary folder, stopped and removed when the test process exits.

Where none works the test fails with a message saying why each step did not — never a skip.
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import sys
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql

from shardq.coordinator.tools.dev.postgres import EmbeddedPostgres
from shardq.coordinator.tools.dev.processes import DevError

EXPLICIT_ENV = "SHARDQ_TEST_DATABASE_URL"
MACHINE_ENV = "SHARDQ_TEST_MACHINE_DATABASE_URL"
DEFAULT_MACHINE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
# A throwaway server: durability buys the tests nothing and costs every commit a flush.
EMBEDDED_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}

# The server this test process uses, once found: (admin URL, what it is).
_chosen: list[tuple[str, str]] = []


class NoPostgres(RuntimeError):
    """No server for the tests' databases; the message says what each step found."""


def _answers(url: str, timeout_s: int = 3) -> str | None:
    """None when the server at ``url`` answers, else why not."""
    try:
        with psycopg.connect(url, connect_timeout=timeout_s) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return " ".join(str(exc).split()) or type(exc).__name__
    return None


def configured_server() -> tuple[str, str] | None:
    """The server steps 1 and 2 name and that answers, without starting anything: (url, what
    it is); None when neither does. Raises NoPostgres when SHARDQ_TEST_DATABASE_URL is set and
    does not answer."""
    explicit = os.environ.get(EXPLICIT_ENV)
    if explicit:
        why = _answers(explicit)
        if why:
            raise NoPostgres(
                f"{EXPLICIT_ENV}={explicit} does not answer ({why}): start that server, fix the "
                f"URL, or unset {EXPLICIT_ENV} to let the tests find or start one"
            )
        return explicit, f"{EXPLICIT_ENV}"
    machine = os.environ.get(MACHINE_ENV, DEFAULT_MACHINE_URL)
    if machine and _answers(machine) is None:
        return machine, "the machine's Postgres"
    return None


def _docker_engine_socket_missing() -> bool:
    """True when DOCKER_HOST (default: the usual socket) names a Unix socket that does not
    exist: no engine, told without importing the Docker SDK or opening a connection."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return host.startswith("unix://") and not Path(host.removeprefix("unix://")).exists()


def _docker_container() -> str:
    """A Postgres container's URL; raises when no Docker engine answers or the start fails."""
    if _docker_engine_socket_missing():
        raise NoPostgres("no Docker engine (no socket at DOCKER_HOST)")
    with warnings.catch_warnings():
        # testcontainers and the docker SDK warn about their own deprecations on import and
        # use, and a failed probe leaves its socket to the garbage collector; the suite turns
        # warnings into errors, which would hide the container or fail a later test.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", ResourceWarning)
        failure = ""
        try:
            from testcontainers.community.postgres import PostgresContainer  # noqa: PLC0415
            from testcontainers.core.docker_client import DockerClient  # noqa: PLC0415

            # Where no engine answers this raises DockerException within milliseconds.
            DockerClient().client.ping()
            container = PostgresContainer("postgres:16", driver=None).start()
        except Exception as exc:  # docker.errors.DockerException, ...
            failure = f"{type(exc).__name__}: {exc}"
        if failure:
            gc.collect()  # the probe's socket, free once `exc` is gone: closed, warning ignored
            raise NoPostgres(failure)
        atexit.register(container.stop)
        url: str = container.get_connection_url()
        return url


def _embedded() -> str:
    """A pgserver Postgres in a temporary folder, for this process's lifetime. It runs under
    ``setpriv --pdeathsig`` (EmbeddedPostgres), so a killed test run leaves no server behind;
    called from the main thread (fixtures), since the signal follows the starting thread."""
    folder = Path(tempfile.mkdtemp(prefix="shardq-test-postgres-"))
    server = EmbeddedPostgres(folder / "data", folder / "postgres.log", EMBEDDED_SETTINGS)

    def stop() -> None:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(stop)
    try:
        return server.start()
    except DevError:
        stop()
        raise


def _find() -> tuple[str, str]:
    found = configured_server()
    if found:
        return found
    machine = os.environ.get(MACHINE_ENV, DEFAULT_MACHINE_URL)
    tried = [f"{MACHINE_ENV}: {machine or 'empty, not tried'}"]
    steps: list[tuple[str, Callable[[], str]]] = [
        ("a Docker container (testcontainers)", _docker_container),
        ("an embedded Postgres (pgserver)", _embedded),
    ]
    for what, start in steps:
        try:
            return start(), what
        except ImportError as exc:
            tried.append(f"{what}: not installed ({exc})")
        except Exception as exc:  # docker.errors.DockerException, DevError, ...
            tried.append(f"{what}: {type(exc).__name__}: {exc}")
    raise NoPostgres(
        "no PostgreSQL for the tests; tried "
        + "; ".join(tried)
        + f". Start PostgreSQL and set {EXPLICIT_ENV}, or run `bash .ci/setup`"
    )


def admin_url() -> str:
    """The chosen server's URL (its ``postgres`` database), found on the first call."""
    if not _chosen:
        url, what = _find()
        _chosen.append((url, what))
        print(f"\ntests: PostgreSQL for throwaway databases: {what} ({url})", file=sys.stderr)
    return _chosen[0][0]


def _with_db(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


@contextmanager
def throwaway_database() -> Iterator[str]:
    """Create a fresh database, yield its psycopg URL, drop it afterwards."""
    admin = admin_url()
    name = f"shardq_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield _with_db(admin, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def sqlalchemy_url(psycopg_url: str) -> str:
    """The same database as a SQLAlchemy URL with the psycopg 3 driver."""
    return psycopg_url.replace("postgresql://", "postgresql+psycopg://", 1)
