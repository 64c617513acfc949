"""A Postgres role per process (``shardq migrate --roles``, proto/shardq/store/roles.py), on the
machine's real Postgres: each role can do what its process needs and nothing that grants or
routes — the worker's credentials cannot mint a token — and a whole cluster runs on them: a
coordinator, a shard loop and a worker process, each logged in as its own role."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from shardq.client import AsyncClient, JobState, RetryPolicy
from shardq.coordinator.tokens import TokenStore
from shardq.coordinator.tools.redis_server import RedisProcess, free_port, parent_death_prefix
from shardq.store import db
from tests.support.coordinator_proc import coordinator_process, prepare_database, wait_for
from tests.support.workers import result_rows

PASSWORDS = {"coordinator": "pw-coordinator", "worker": "pw-worker", "loop": "pw-loop"}
# The shardq of this interpreter (a fresh machine has no venv on PATH).
SHARDQ = str(Path(sys.executable).parent / "shardq")


def migrate_roles(database_url: str, prefix: str, **env: str) -> subprocess.CompletedProcess[str]:
    variables = {**os.environ, "SHARDQ_DATABASE_URL": database_url, **env}
    return subprocess.run(
        [SHARDQ, "migrate", "--roles", "--role-prefix", prefix],
        env=variables,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def role_url(database_url: str, prefix: str, role: str) -> str:
    """The database URL with the role's login (the machine's Postgres trusts local logins, so
    the password is not what is tested here: the role's grants are)."""
    url = db.psycopg_dsn(database_url)
    rest = url.split("@", 1)[1]
    return f"postgresql://{prefix}{role}:{PASSWORDS[role]}@{rest}"


@contextmanager
def roles_dropped_after(database_url: str, prefix: str) -> Iterator[None]:
    """Roles are cluster-wide: drop the test's own when it ends (its database goes too)."""
    try:
        yield
    finally:
        with psycopg.connect(db.psycopg_dsn(database_url), autocommit=True) as conn:
            for role in PASSWORDS:
                name = sql.Identifier(f"{prefix}{role}")
                exists = conn.execute(
                    "SELECT 1 FROM pg_roles WHERE rolname = %s", (f"{prefix}{role}",)
                ).fetchone()
                if exists:
                    conn.execute(sql.SQL("DROP OWNED BY {}").format(name))
                    conn.execute(sql.SQL("DROP ROLE {}").format(name))


def denied(url: str, statement: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            conn.execute(statement)
        except psycopg.errors.InsufficientPrivilege:
            return True
    return False


def password_env() -> dict[str, str]:
    return {f"SHARDQ_DB_PASSWORD_{role.upper()}": pw for role, pw in PASSWORDS.items()}


NEW_TOKEN = (
    "INSERT INTO shardq_tokens (token_id, token_hash, role, name) "
    "VALUES ('0123456789ab', 'x', 'admin', 'minted')"
)


def test_each_role_gets_its_tables_and_no_process_role_can_mint_a_token(
    database_url: str,
) -> None:
    prefix = f"t{secrets.token_hex(4)}_"
    with roles_dropped_after(database_url, prefix):
        done = migrate_roles(database_url, prefix, **password_env())
        assert done.returncode == 0, done.stderr
        for role in PASSWORDS:
            assert f"role {prefix}{role} ({role}): can log in" in done.stdout
        worker = role_url(database_url, prefix, "worker")
        coordinator = role_url(database_url, prefix, "coordinator")
        loop = role_url(database_url, prefix, "loop")

        for url in (worker, coordinator, loop):
            assert denied(url, NEW_TOKEN)
            assert denied(url, "UPDATE shardq_tokens SET revoked_at = now()")
        for url in (worker, loop):
            assert denied(url, "SELECT * FROM shardq_tokens")
            assert denied(url, "UPDATE shardq_shards SET address = 'evil:6379'")
            assert denied(url, "DELETE FROM shardq_results")
            assert not denied(url, "SELECT count(*) FROM shardq_results")
        assert not denied(coordinator, "SELECT count(*) FROM shardq_tokens")
        assert not denied(coordinator, "UPDATE shardq_shards SET state = state")
        assert denied(coordinator, "UPDATE shardq_results SET status = 'succeeded'")

        # A grant made by hand on shardq's tables goes at the next run; one on the
        # application's own table stays (handlers write there).
        with psycopg.connect(db.psycopg_dsn(database_url), autocommit=True) as conn:
            conn.execute(f"GRANT INSERT ON shardq_tokens TO {prefix}worker")
            conn.execute("CREATE TABLE app_ledger (n int)")
            conn.execute(f"GRANT INSERT ON app_ledger TO {prefix}worker")
        assert not denied(worker, NEW_TOKEN.replace("0123456789ab", "aaaaaaaaaaaa"))
        again = migrate_roles(database_url, prefix, **password_env())
        assert again.returncode == 0, again.stderr
        assert denied(worker, NEW_TOKEN.replace("0123456789ab", "bbbbbbbbbbbb"))
        assert not denied(worker, "INSERT INTO app_ledger VALUES (1)")

        # The operator's CLI on the worker's URL cannot mint one either: one line, exit 1.
        minted = subprocess.run(
            [SHARDQ, "tokens", "create", "--admin", "--database-url", worker],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert minted.returncode == 1, minted
        assert "permission denied" in minted.stderr.lower(), minted.stderr
        assert "Traceback" not in minted.stderr


def test_a_role_without_a_password_is_nologin_and_a_bad_prefix_is_refused(
    database_url: str,
) -> None:
    prefix = f"t{secrets.token_hex(4)}_"
    with roles_dropped_after(database_url, prefix):
        done = migrate_roles(database_url, prefix, SHARDQ_DB_PASSWORD_WORKER="pw")
        assert done.returncode == 0, done.stderr
        assert f"role {prefix}worker (worker): can log in" in done.stdout
        assert f"role {prefix}loop (loop): NOLOGIN" in done.stdout
        with pytest.raises(psycopg.OperationalError, match="not permitted to log in"):
            psycopg.connect(role_url(database_url, prefix, "loop")).close()
    refused = migrate_roles(database_url, "Bad-Prefix")
    assert refused.returncode == 1
    assert "role name 'Bad-Prefixcoordinator'" in refused.stderr


async def test_a_cluster_runs_with_each_process_on_its_own_role(database_url: str) -> None:
    prefix = f"t{secrets.token_hex(4)}_"
    shard = RedisProcess().start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with roles_dropped_after(database_url, prefix):
            admin = await prepare_database(database_url, [shard])
            done = migrate_roles(database_url, prefix, **password_env())
            assert done.returncode == 0, done.stderr
            engine = db.make_engine(database_url)
            try:
                _, worker_token = await TokenStore(engine).create("worker")
                _, tenant_token = await TokenStore(engine).create("tenant", "acme")
            finally:
                await engine.dispose()
            common = {**os.environ, "SHARDQ_KEY_PREFIX": "sq", "SHARDQ_LOG_LEVEL": "WARNING"}
            async with coordinator_process(
                role_url(database_url, prefix, "coordinator"), admin
            ) as coordinator:
                procs.append(
                    spawn(
                        "shardq.shard",
                        common,
                        SHARDQ_REDIS_URL=shard.url,
                        SHARDQ_SHARD_ID="0",
                        SHARDQ_DATABASE_URL=role_url(database_url, prefix, "loop"),
                        SHARDQ_METRICS_PORT=str(free_port()),
                    )
                )
                procs.append(
                    spawn(
                        "shardq.worker",
                        common,
                        SHARDQ_HANDLERS="tests.support.handlers",
                        SHARDQ_COORDINATOR=coordinator.target,
                        SHARDQ_WORKER_TOKEN=worker_token,
                        SHARDQ_DATABASE_URL=role_url(database_url, prefix, "worker"),
                        SHARDQ_METRICS_PORT=str(free_port()),
                    )
                )
                async with AsyncClient(
                    coordinator.target, tenant_token, retry=RetryPolicy(attempts=1)
                ) as acme:
                    ok = await acme.submit("test.work", {"n": 1}, request_id="ok")
                    bad = await acme.submit("test.permanent", {}, request_id="bad")
                    later = await acme.submit("test.work", {}, request_id="later", delay=3600)
                    await acme.cancel(later.job_id)
                    assert (await acme.wait(ok.job_id, timeout=60)).state is JobState.SUCCEEDED
                    rows = await wait_for(
                        lambda: result_rows(database_url),
                        lambda rows: len(rows) == 3,
                        timeout_s=60,
                        what="three result rows",
                    )
                    by_request = {r["request_id"]: r["status"] for r in rows}
                    assert by_request == {"ok": "succeeded", "bad": "dead", "later": "cancelled"}
                    # The coordinator, on its role, reads a result back.
                    assert (await acme.get(ok.job_id)).result["n"] == 1
                    assert bad.job_id
                for p in procs:
                    assert p.poll() is None, f"{p.args} exited with {p.returncode}"
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
        shard.cleanup()


def spawn(module: str, env: dict[str, str], **more: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*parent_death_prefix(), sys.executable, "-m", module], env={**env, **more}
    )
