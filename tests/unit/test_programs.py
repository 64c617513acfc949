"""The console scripts (``shardq._programs``): each imports its program with the garbage
collector paused, then freezes what the imports made and turns the collector back on before
the program runs; ``main`` called inside another process (a test's, a service's) leaves that
process's collector alone."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from shardq.coordinator import cli

#: Run in a fresh interpreter: one program's function as its console script calls it, with
#: ``--help`` (the program has imported everything, resumed the collector and parsed its
#: arguments when argparse exits), then the collector's state.
_RUN = """
import gc, json, sys
from shardq import _programs
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    getattr(_programs, sys.argv[0])()
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
"""


@pytest.mark.parametrize(
    "argv",
    [["shardq", "migrate", "--help"], ["shardq", "--help"], ["coordinator", "--help"],
     ["shard", "--help"], ["worker", "--help"], ["dashboard", "--help"]],
    ids=" ".join,
)  # fmt: skip
def test_a_program_runs_with_the_collector_on_and_its_imports_frozen(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _RUN, *argv], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout.splitlines()[-1])
    assert state["enabled"] is True
    # The imports' objects (a server's ~100k; the CLI's root alone some thousands) left out
    # of every later collection.
    assert state["frozen"] > 5_000, state


def test_main_inside_another_process_leaves_its_collector_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    frozen = gc.get_freeze_count()
    with pytest.raises(SystemExit):
        cli.main(["migrate", "--help"])
    assert "usage: shardq migrate" in capsys.readouterr().out
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    gc.disable()  # a process that runs with the collector off keeps it off
    try:
        with pytest.raises(SystemExit):
            cli.main(["migrate", "--help"])
        assert not gc.isenabled()
    finally:
        gc.enable()


_RUN_MODULE = """
import gc, json, sys
from shardq import _programs
try:
    _programs.run_module(["-m", *sys.argv[1:]])
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(), "argv": sys.argv}))
"""


@pytest.mark.parametrize(
    "module",
    ["shardq.worker", "shardq.shard", "shardq.coordinator.server", "shardq.coordinator.dashboard"],
)
def test_a_server_started_by_module_runs_as_its_script_does(module: str) -> None:
    """``python -m shardq._programs MODULE`` (how ``shardq dev`` and ``--processes`` start
    servers): the collector on, the imports frozen, and the server's own arguments."""
    done = subprocess.run(
        [sys.executable, "-c", _RUN_MODULE, module, "--help"], capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
    state = json.loads(done.stdout.splitlines()[-1])
    assert state["enabled"] is True and state["frozen"] > 5_000, state
    assert state["argv"] == [module, "--help"]


def test_an_unknown_module_is_refused_with_the_ones_there_are() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "shardq._programs", "shardq.nope"], capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "shardq.coordinator.server,shardq.coordinator.dashboard,shardq.shard" in done.stderr
