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


def test_an_unknown_fault_is_refused_before_anything_starts(tmp_path: Path) -> None:
    run = soak("--seconds", "1", "--faults", "worker-kill,meteor", timeout_s=60)
    assert run.returncode == 2
    assert "unknown faults ['meteor']" in run.stderr
    assert "worker-kill" in run.stderr  # the ones it knows are named
    assert "Traceback" not in run.stderr
