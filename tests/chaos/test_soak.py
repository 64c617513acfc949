"""``shardq soak`` through the installed command: a short run of its own cluster under load
and every fault, ending with the reconciliation it prints and its exit code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(420)]

SHARDQ = str(Path(sys.executable).parent / "shardq")


def soak(*argv: str, timeout_s: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SHARDQ, "soak", *argv], capture_output=True, text=True, timeout=timeout_s, check=False
    )


def test_a_short_soak_with_every_fault_ends_with_an_ok_reconciliation(
    database_url: str, tmp_path: Path
) -> None:
    run = soak(
        "--seconds", "40", "--fault-every-s", "3", "--seed", "5", "--rate", "10",
        "--tenants", "3", "--settle-s", "180", "--database-url", database_url,
        "--data-dir", str(tmp_path / "soak"),
    )  # fmt: skip
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "reconciliation: OK" in run.stdout
    assert re.search(r"^  lost +0$", run.stdout, re.MULTILINE)
    faults = re.search(r"^  faults +(.+)$", run.stdout, re.MULTILINE)
    assert faults, run.stdout
    injected = dict(re.findall(r"([a-z-]+) (\d+)", faults.group(1)))
    assert sum(map(int, injected.values())) >= 5, injected
    accepted = re.search(r"^  accepted +(\d+)$", run.stdout, re.MULTILINE)
    assert accepted and int(accepted.group(1)) > 100, run.stdout


def test_a_short_soak_with_replicas_fails_over_and_counts_recovery_from_the_last_fault(
    database_url: str, tmp_path: Path
) -> None:
    """``--replicas``: each shard a primary, a replica and three sentinels; the failover fault
    kills a primary, the sentinels promote the replica, and nothing acknowledged is lost.
    Recovery is counted from the last fault, which the report places before the load's end."""
    run = soak(
        "--seconds", "60", "--fault-every-s", "8", "--seed", "11", "--rate", "10",
        "--tenants", "3", "--shards", "1", "--replicas", "1", "--workers", "2",
        "--faults", "failover,worker-kill", "--settle-s", "180",
        "--database-url", database_url, "--data-dir", str(tmp_path / "soak"),
    )  # fmt: skip
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "reconciliation: OK" in run.stdout
    assert re.search(r"^  lost +0$", run.stdout, re.MULTILINE)
    # At least one failover, each to another Redis, the old primary back as its replica.
    failover = r"^soak: fault failover: shard 0: primary (\d+) -> (\d+), (\d+) back as a replica$"
    promoted = re.findall(failover, run.stdout, re.MULTILINE)
    assert promoted, run.stdout
    assert all(old != new and back == old for old, new, back in promoted), promoted
    last = re.search(
        r"^  last fault +ended ([\d.]+) s before the end of the load$", run.stdout, re.M
    )
    recovery = re.search(r"^  recovery time +([\d.]+) s$", run.stdout, re.MULTILINE)
    assert last and recovery, run.stdout
    # Counted from the last fault: at least the load that ran after it.
    assert float(recovery.group(1)) >= float(last.group(1))


def test_recovery_counts_from_the_last_fault_not_from_the_end_of_the_load(
    database_url: str, tmp_path: Path
) -> None:
    """One fault, ~11 s before the load ends: the recovery time includes those seconds (from
    the end of the load it would be the second or two the last jobs take)."""
    run = soak(
        "--seconds", "30", "--fault-every-s", "18", "--seed", "3", "--rate", "5",
        "--tenants", "2", "--shards", "1", "--workers", "2", "--faults", "worker-kill",
        "--settle-s", "120", "--database-url", database_url,
        "--data-dir", str(tmp_path / "soak"),
    )  # fmt: skip
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"^  faults +worker-kill 1$", run.stdout, re.MULTILINE), run.stdout
    last_line = r"^  last fault +ended ([\d.]+) s before the end of the load$"
    last = re.search(last_line, run.stdout, re.MULTILINE)
    recovery = re.search(r"^  recovery time +([\d.]+) s$", run.stdout, re.MULTILINE)
    assert last and recovery, run.stdout
    assert float(last.group(1)) >= 5  # the fault ended well before the load did
    assert float(recovery.group(1)) >= float(last.group(1))


def test_a_failover_without_replicas_is_refused(tmp_path: Path) -> None:
    run = soak("--seconds", "1", "--faults", "failover", timeout_s=60)
    assert run.returncode == 2
    assert "failover needs --replicas 1 or more" in run.stderr


def test_an_unknown_fault_is_refused_before_anything_starts(tmp_path: Path) -> None:
    run = soak("--seconds", "1", "--faults", "worker-kill,meteor", timeout_s=60)
    assert run.returncode == 2
    assert "unknown faults ['meteor']" in run.stderr
    assert "worker-kill" in run.stderr  # the ones it knows are named
    assert "Traceback" not in run.stderr
