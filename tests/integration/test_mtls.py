"""mTLS end to end: a real coordinator process that requires client certificates
(``--tls-client-ca-file``), real ``shardq-worker`` processes and the real ``shardq`` command.

With a certificate its CA signed, a worker gets its shards and runs a job to its result row,
and the CLI lists jobs; without one, or with one another CA signed, the coordinator closes the
connection in the TLS handshake, and the worker's log and the CLI's error line say what that
usually means. A TLS file that cannot be used stops the CLI with one line, exit 2."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from shardq.client import AsyncClient, RetryPolicy
from shardq.coordinator.tokens import TokenStore
from shardq.coordinator.tools.redis_server import RedisProcess, free_port, parent_death_prefix
from shardq.store import db
from tests.support.coordinator_proc import CoordinatorProcess, coordinator_process, prepare_database
from tests.support.pki import make_pki
from tests.support.procs import WorkerProcess, wait_until_serving
from tests.support.workers import wait_for_rows


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield make_pki(tmp_path_factory.mktemp("pki"))


@asynccontextmanager
async def mtls_coordinator(database_url: str, pki: Path) -> AsyncIterator[CoordinatorProcess]:
    """A coordinator process over one redis-server shard that serves TLS and requires a
    client certificate signed by the test CA."""
    shard = RedisProcess().start()
    try:
        admin = await prepare_database(database_url, [shard])
        async with coordinator_process(
            database_url,
            admin,
            tls_cert_file=pki / "server.pem",
            tls_key_file=pki / "server.key",
            tls_client_ca_file=pki / "ca.pem",
        ) as coordinator:
            yield coordinator
    finally:
        shard.cleanup()


async def tenant_token(database_url: str, tenant: str) -> str:
    engine = db.make_engine(database_url)
    try:
        return (await TokenStore(engine).create("tenant", tenant))[1]
    finally:
        await engine.dispose()


def client(coordinator: CoordinatorProcess, token: str, pki: Path) -> AsyncClient:
    """An SDK client with the test CA's client certificate."""
    cert = ((pki / "client.key").read_bytes(), (pki / "client.pem").read_bytes())
    return AsyncClient(
        coordinator.target,
        token,
        root_certificates=(pki / "ca.pem").read_bytes(),
        client_cert=cert,
        retry=RetryPolicy(attempts=1),
    )


def start_worker(
    coordinator: CoordinatorProcess, name: str, log: IO[bytes], **flags: object
) -> WorkerProcess:
    """A ``python -m shardq.worker`` process on ``coordinator`` that trusts the test CA, its
    JSON log lines (INFO and up) to ``log``; ``flags`` add SHARDQ_<NAME> variables."""
    port = free_port()
    env = {
        **os.environ,
        "SHARDQ_HANDLERS": "tests.support.handlers",
        "SHARDQ_COORDINATOR": coordinator.target,
        "SHARDQ_WORKER_TOKEN": coordinator.admin_token,
        "SHARDQ_DATABASE_URL": coordinator.database_url,
        "SHARDQ_KEY_PREFIX": "sq",
        "SHARDQ_WORKER_ID": name,
        "SHARDQ_METRICS_PORT": str(port),
        "SHARDQ_LEASE_MS": "1000",
        "SHARDQ_DRAIN_GRACE_S": "5",
        "SHARDQ_LOG_LEVEL": "INFO",
    }
    env.update({f"SHARDQ_{k.upper()}": str(v) for k, v in flags.items()})
    proc = subprocess.Popen(
        [*parent_death_prefix(), sys.executable, "-m", "shardq.worker"], env=env, stderr=log
    )
    return WorkerProcess(name, proc, port)


async def unreachable_line(w: WorkerProcess, log: Path, timeout_s: float = 30) -> str:
    """The message of the worker's first "coordinator ... unreachable" log line."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        text = await asyncio.to_thread(log.read_text)
        for line in text.splitlines():
            record: dict[str, Any] = json.loads(line)
            if "unreachable" in record["msg"]:
                msg: str = record["msg"]
                return msg
        assert w.proc.poll() is None, f"worker {w.worker_id} exited:\n{text}"
        assert loop.time() < deadline, f"no unreachable line in {timeout_s}s:\n{text}"
        await asyncio.sleep(0.05)


async def test_a_worker_with_a_client_certificate_runs_a_job_to_its_row(
    database_url: str, pki: Path, tmp_path: Path
) -> None:
    async with mtls_coordinator(database_url, pki) as coordinator:
        token = await tenant_token(database_url, "acme")
        log_path = tmp_path / "worker.log"
        with log_path.open("wb") as log:
            w = start_worker(
                coordinator,
                "w-cert",
                log,
                tls_ca_file=pki / "ca.pem",
                tls_cert_file=pki / "client.pem",
                tls_key_file=pki / "client.key",
            )
            try:
                await wait_until_serving(w, shards=1)
                async with client(coordinator, token, pki) as acme:
                    job = await acme.submit("test.work", {"n": 7}, request_id="mtls-1")
                (row,) = await wait_for_rows(database_url, 1)
                assert (row["job_id"], row["status"]) == (job.job_id, "succeeded")
                assert (row["worker_id"], row["result"]["n"]) == ("w-cert", 7)
            finally:
                assert w.stop() == 0, log_path.read_text()


async def test_a_worker_without_a_certificate_its_ca_signed_cannot_connect_and_says_why(
    database_url: str, pki: Path, tmp_path: Path
) -> None:
    async with mtls_coordinator(database_url, pki) as coordinator:
        none_log, stranger_log = tmp_path / "none.log", tmp_path / "stranger.log"
        with none_log.open("wb") as log1, stranger_log.open("wb") as log2:
            without = start_worker(coordinator, "w-none", log1, tls_ca_file=pki / "ca.pem")
            stranger = start_worker(
                coordinator,
                "w-stranger",
                log2,
                tls_ca_file=pki / "ca.pem",
                tls_cert_file=pki / "stranger.pem",
                tls_key_file=pki / "stranger.key",
            )
            try:
                msg = await unreachable_line(without, none_log)
                assert "Socket closed" in msg, msg
                assert "give this client one with --tls-cert-file and --tls-key-file" in msg
                msg = await unreachable_line(stranger, stranger_log)
                assert "it may refuse this client certificate" in msg, msg
                # Refused, both are up and serve nothing: no assignment reached them.
                for w in (without, stranger):
                    health = await asyncio.to_thread(w.health)
                    assert health is not None and health["shards"] == [], health
            finally:
                without.stop()
                stranger.stop()


async def shardq(
    pki: Path, data_dir: Path, *argv: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m shardq.coordinator.cli ARGV...`` with ``env`` added (no `shardq dev` env
    file: its data dir is the test's own)."""
    variables = {**os.environ, "SHARDQ_DEV_DATA_DIR": str(data_dir), **env}
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "shardq.coordinator.cli", *argv],
        env=variables,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_line(run: subprocess.CompletedProcess[str], code: int, start: str) -> str:
    assert run.returncode == code, run
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert lines[0].startswith(start), lines[0]
    return lines[0]


async def test_the_cli_lists_jobs_with_a_client_certificate_and_says_why_not_without(
    database_url: str, pki: Path, tmp_path: Path
) -> None:
    async with mtls_coordinator(database_url, pki) as coordinator:
        token = await tenant_token(database_url, "acme")
        async with client(coordinator, token, pki) as acme:
            job = await acme.submit("test.work", {"n": 1}, request_id="cli-1")
        base = ["jobs", "list", "--state", "ready", "--json", "--coordinator", coordinator.target,
                "--token", token, "--ca-file", str(pki / "ca.pem")]  # fmt: skip
        ok = await shardq(
            pki, tmp_path, *base, "--cert-file", str(pki / "client.pem"),
            "--key-file", str(pki / "client.key"),
        )  # fmt: skip
        assert ok.returncode == 0, ok.stderr
        assert job.job_id in ok.stdout
        # The same from the variables.
        from_env = await shardq(
            pki, tmp_path, *base, SHARDQ_CERT_FILE=str(pki / "client.pem"),
            SHARDQ_KEY_FILE=str(pki / "client.key"),
        )  # fmt: skip
        assert from_env.returncode == 0, from_env.stderr
        assert job.job_id in from_env.stdout

        line = one_line(await shardq(pki, tmp_path, *base), 1, "error: UNAVAILABLE: ")
        assert "give this client one with --cert-file and --key-file" in line, line
        stranger = await shardq(
            pki, tmp_path, *base, "--cert-file", str(pki / "stranger.pem"),
            "--key-file", str(pki / "stranger.key"),
        )  # fmt: skip
        line = one_line(stranger, 1, "error: UNAVAILABLE: ")
        assert "it may refuse this client certificate" in line, line

        # Files that cannot be used: a usage error, before any call.
        missing = await shardq(
            pki, tmp_path, *base, "--cert-file", str(pki / "client.pem"),
            "--key-file", str(tmp_path / "nope.key"),
        )  # fmt: skip
        line = one_line(missing, 2, "shardq: error: --key-file: cannot read ")
        assert "No such file or directory" in line, line
        alone = await shardq(pki, tmp_path, *base, "--cert-file", str(pki / "client.pem"))
        line = one_line(alone, 2, "shardq: error: --cert-file (SHARDQ_CERT_FILE) is set without")
        assert "--key-file (SHARDQ_KEY_FILE)" in line, line
