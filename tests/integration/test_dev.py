"""``shardq dev`` through the README's run command (``bash .ci/dev``), as a newcomer runs it:
every example handler reaches its final state over gRPC with the printed token, Ctrl-C
(SIGINT) and SIGTERM leave no process behind, and a restart on the same data folder keeps
the results and runs the jobs that were scheduled before the stop.

One test uses a throwaway database on the machine's Postgres (``--database-url``); the
restart test uses the embedded Postgres of the ``pgserver`` wheel.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from shardq.client import AsyncClient, Job, JobOptions, JobState, RetryPolicy
from shardq.common.errors import InvalidArgument
from shardq.coordinator.tokens import TokenStore
from shardq.coordinator.tools.redis_server import free_port
from shardq.store.migrate import upgrade
from tests.support.postgres import throwaway_database
from tests.support.procs import ReadyLines

ROOT = Path(__file__).resolve().parents[2]
SUCCEEDED, DEAD, SCHEDULED = (
    JobState.SUCCEEDED,
    JobState.DEAD,
    JobState.SCHEDULED,
)


def free_port_range(count: int) -> int:
    """A base port with ``count`` free ports from it."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 60_000 - count)
        if all(_port_free(base + i) for i in range(count)):
            return base
    raise RuntimeError("no free port range")


def _port_free(port: int) -> bool:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def alive(pid: int) -> bool:
    """Running (a zombie that nobody reaped yet counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return "State:\tZ" not in status


def descendants(root: int) -> set[int]:
    """Every process under ``root``, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        pid = int(stat.parent.name)
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(pid)
    out: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def processes_mentioning(text: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes() and alive(int(cmdline.parent.name)):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


class Dev(ReadyLines):
    """``bash .ci/dev ARGS`` in the background, its output collected line by line."""

    def __init__(self, args: list[str]) -> None:
        super().__init__(["bash", ".ci/dev", *args], cwd=ROOT)

    def wait_ready(self, timeout_s: float = 90, settle_s: float = 0.3) -> str:
        return super().wait_ready(timeout_s, settle_s)


def printed_tokens(output: str) -> tuple[str, dict[str, str]]:
    admin = re.search(r"^\s+admin token\s+(sq_\S+)$", output, re.M)
    tenants = dict(re.findall(r"^\s+tenant (\S+) token\s+(sq_\S+)$", output, re.M))
    assert admin and tenants, output
    return admin.group(1), tenants


def started_pids(dev: Dev, data_dir: Path) -> set[int]:
    doc = json.loads((data_dir / "pids.json").read_text())
    assert doc["dev"] == dev.proc.pid and doc["running"] is True
    recorded = set(doc["processes"].values())
    names = set(doc["processes"])
    assert {"coordinator", "shard-0", "shard-1", "worker-0", "worker-1"} <= names, names
    assert {"redis-0", "redis-1"} <= names, names
    return recorded | descendants(dev.proc.pid)


def assert_all_gone(pids: set[int], data_dir: Path) -> None:
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = sorted(p for p in pids if alive(p))
    assert not left, f"left running: {left}"
    assert not processes_mentioning(str(data_dir)), "a process still uses the data dir"
    assert json.loads((data_dir / "pids.json").read_text())["running"] is False


def dev_args(data_dir: Path, port: int, base: int, *extra: str) -> list[str]:
    return [
        "--shards", "2", "--workers", "2", "--port", str(port), "--data-dir", str(data_dir),
        "--redis-base-port", str(base), "--no-live", "--status-interval-s", "1", *extra,
    ]  # fmt: skip


async def run_every_handler(target: str, token: str) -> dict[str, Job]:
    submits: dict[str, tuple[str, dict[str, Any], JobOptions]] = {
        "echo": ("echo", {"hello": "world"}, {}),
        "sleep": ("sleep", {"ms": 200}, {}),
        "flaky": ("flaky", {"fail_times": 2}, {"max_attempts": 5}),
        "fail": ("fail", {"why": "test"}, {"max_attempts": 3}),
        "ledger.add": ("ledger.add", {"account": "a", "amount": 5}, {}),
        "priority": ("echo", {"urgent": True}, {"priority": 9}),
    }
    async with AsyncClient(target, token, retry=RetryPolicy(attempts=3)) as client:
        jobs = {
            name: (await client.submit(handler, payload, **opts)).job_id
            for name, (handler, payload, opts) in submits.items()
        }
        finals = await asyncio.wait_for(
            asyncio.gather(*(client.wait(j) for j in jobs.values())), 30
        )
        out = dict(zip(jobs, finals, strict=True))
        dead = await client.list_dead()
        assert jobs["fail"] in {j.job_id for j in dead.items}
    return out


def test_dev_runs_every_example_handler_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "dev"
    port, base = free_port(), free_port_range(2)
    with throwaway_database() as url:
        dev = Dev(dev_args(data_dir, port, base, "--database-url", url))
        demo: subprocess.Popen[str] | None = None
        second: subprocess.Popen[str] | None = None
        try:
            output = dev.wait_ready()
            _, tenants = printed_tokens(output)
            assert "submit echo" in output and "from shardq import Client" in output
            pids = started_pids(dev, data_dir)

            # Alongside: the demo workload with the stored admin token, and a second
            # `shardq dev` on the same folder, which is refused at once.
            demo_args = ["--data-dir", str(data_dir), "--tenants", "acme,globex", "--json"]
            demo = _run_shardq("demo", "--coordinator", f"127.0.0.1:{port}", *demo_args)
            second = _run_shardq("dev", *dev_args(data_dir, free_port(), base))

            jobs = asyncio.run(run_every_handler(f"127.0.0.1:{port}", tenants["demo"]))
            for name in ("echo", "sleep", "flaky", "ledger.add", "priority"):
                assert jobs[name].state == SUCCEEDED, (name, jobs[name])
            assert jobs["echo"].result == {"hello": "world"}
            assert jobs["flaky"].attempts == 3
            assert jobs["flaky"].result == {"succeeded_on_attempt": 3}
            assert jobs["fail"].state == DEAD and jobs["fail"].attempts == 3
            assert "always fails" in (jobs["fail"].error or "")
            with psycopg.connect(url) as conn:
                rows = conn.execute("SELECT account, amount FROM shardq_example_ledger").fetchall()
            # The demo running alongside adds its own ledger rows (acct-*): look at ours.
            assert [r for r in rows if r[0] == "a"] == [("a", 5)]

            out, err = demo.communicate(timeout=30)
            assert demo.returncode == 0, err
            assert set(json.loads(out)["submitted"]) == {"acme", "globex"}
            _, err = second.communicate(timeout=30)
            assert second.returncode == 1 and "another `shardq dev`" in err, err
            time.sleep(1.2)  # a status line after the dead letter
            assert re.search(r"^shardq dev status: .*dead=[1-9]", dev.output, re.M), dev.output
        finally:
            for child in (demo, second):
                if child is not None and child.poll() is None:
                    child.kill()
                if child is not None:
                    child.communicate(timeout=30)  # closes its pipes, reaps it
            code = dev.stop(signal.SIGINT)
        assert code == 0, dev.output
        assert "shardq dev: stopped" in dev.output
        assert_all_gone(pids, data_dir)


def _run_shardq(*args: str) -> subprocess.Popen[str]:
    shardq = Path(sys.executable).parent / "shardq"
    return subprocess.Popen(
        [str(shardq), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_restart_keeps_results_and_runs_what_was_scheduled(tmp_path: Path) -> None:
    """Embedded Postgres (pgserver); stopped with SIGTERM, started again on the same folder."""
    data_dir = tmp_path / "dev"
    port, base = free_port(), free_port_range(2)
    target = f"127.0.0.1:{port}"

    async def before_stop(token: str) -> tuple[str, str]:
        async with AsyncClient(target, token, retry=RetryPolicy(attempts=3)) as client:
            done = await client.submit("echo", {"before": "stop"})
            final = await asyncio.wait_for(client.wait(done.job_id), 20)
            assert final.state == SUCCEEDED
            later = await client.submit("echo", {"scheduled": "before stop"}, delay=5)
            assert later.job.state == SCHEDULED
            return done.job_id, later.job_id

    async def after_restart(token: str, done_id: str, later_id: str) -> None:
        async with AsyncClient(target, token, retry=RetryPolicy(attempts=3)) as client:
            done = await client.get(done_id)
            assert done.state == SUCCEEDED
            assert done.result == {"before": "stop"}
            later = await asyncio.wait_for(client.wait(later_id), 30)
            assert later.state == SUCCEEDED
            assert later.result == {"scheduled": "before stop"}

    dev = Dev(dev_args(data_dir, port, base))
    try:
        output = dev.wait_ready(120)
        assert "embedded (postgresql://" in output
        admin, tenants = printed_tokens(output)
        pids = started_pids(dev, data_dir)
        assert "postgres" in json.loads((data_dir / "pids.json").read_text())["processes"]
        done_id, later_id = asyncio.run(before_stop(tenants["demo"]))
    finally:
        code = dev.stop(signal.SIGTERM)
    assert code == 0, dev.output
    assert_all_gone(pids, data_dir)

    again = Dev(dev_args(data_dir, port, base))
    try:
        output = again.wait_ready(120)
        assert printed_tokens(output) == (admin, tenants), "tokens are reused on a restart"
        pids = started_pids(again, data_dir)
        asyncio.run(after_restart(tenants["demo"], done_id, later_id))
    finally:
        code = again.stop(signal.SIGINT)
    assert code == 0, again.output
    assert_all_gone(pids, data_dir)


async def test_a_given_token_is_registered_under_the_id_it_carries(database_url: str) -> None:
    """``shardq dev --token TENANT=TOKEN``: TokenStore.create(token=...) keeps the hashing."""
    await asyncio.to_thread(upgrade, database_url)
    from shardq.store import db  # noqa: PLC0415

    engine = db.make_engine(database_url)
    try:
        store = TokenStore(engine)
        token = "sq_0123456789ab_" + "A" * 43
        token_id, same = await store.create("tenant", "acme", token=token)
        assert (token_id, same) == ("0123456789ab", token)
        principal = await store.authenticate(token)
        assert principal is not None and principal.tenant_id == "acme"
        with pytest.raises(InvalidArgument):
            await store.create("tenant", "acme", token="not-a-token")
    finally:
        await engine.dispose()


def test_configuration_doc_lists_every_flag_and_variable() -> None:
    """docs/configuration.md: one table of every SHARDQ_* variable and flag of every program."""
    import argparse  # noqa: PLC0415

    import shardq.coordinator.server  # noqa: PLC0415
    import shardq.shard.__main__  # noqa: PLC0415
    import shardq.worker.__main__  # noqa: PLC0415
    from shardq.coordinator import cli  # noqa: PLC0415

    parsers: list[argparse.ArgumentParser] = []
    real = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *args: object, **kw: object) -> None:
        parsers.append(self)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[assignment,method-assign]
    try:
        for mod in (shardq.coordinator.server, shardq.shard.__main__, shardq.worker.__main__):
            with pytest.raises(SystemExit):
                mod.parse_args([])
    finally:
        argparse.ArgumentParser.parse_args = real  # type: ignore[method-assign]
    root = cli.build_parser()
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    parsers += [sub.choices[name] for name in ("migrate", "get", "dev")]

    doc = (ROOT / "docs" / "configuration.md").read_text()
    missing = []
    for parser in parsers:
        for action in parser._actions:
            if action.dest == "help" or not action.option_strings:
                continue
            var = re.search(r"\[(SHARDQ_[A-Z0-9_]+)", action.help or "")
            names = [f"`{action.option_strings[0]}`"] + ([f"`{var.group(1)}`"] if var else [])
            missing += [f"{parser.prog}: {n}" for n in names if n not in doc]
    assert not missing, missing
