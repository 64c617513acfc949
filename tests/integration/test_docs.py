"""Every command and code block of README.md and docs/*.md, run as a reader runs it, against
a real ``shardq dev`` cluster (embedded Postgres, two Redis shards, coordinator, shard loops,
two workers on the example handlers): ``sh`` blocks in a fresh ``bash -e -o pipefail`` with
the venv on PATH, ``python`` blocks as scripts with the cluster's ``shardq.env`` in their
environment (as after ``set -a; . ~/.cache/shardq/dev/shardq.env; set +a``). A block shown
with its output (``<!-- output -->``) must print it. A block that cannot run here carries
``<!-- not-run: REASON -->`` and nothing else is skipped (tests/support/docs.py).

The reader's cluster is ``shardq dev`` with its defaults; this one differs in two ways only,
because the machine is shared: HOME is a folder of the test's own (so the default data dir
``~/.cache/shardq/dev`` is fresh), and the coordinator and Redis listen on free ports, so the
documented ``127.0.0.1:50051`` in a block is replaced with the cluster's address.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from shardq.common import config
from tests.support import docs

VENV_BIN = Path(sys.executable).parent
DOCUMENTED_ADDRESSES = ("127.0.0.1:50051", "localhost:50051")
ALL = docs.all_blocks()
RUN = [b for b in ALL if b.lang in docs.RUNNABLE and b.not_run is None]


@pytest.fixture(scope="module")
def cluster() -> Iterator[docs.DevProcess]:
    # Not under pytest's basetemp: each pytest session (another run on this machine too)
    # resets /tmp/pytest-of-<user> to 0700, and the embedded Postgres runs as `pgserver`.
    home = Path(tempfile.mkdtemp(prefix="shardq-docs-home-"))
    c = docs.DevProcess(home)
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop()
        shutil.rmtree(home, ignore_errors=True)


def run_block(block: docs.Block, cluster: docs.DevProcess) -> subprocess.CompletedProcess[str]:
    code = block.code
    for address in DOCUMENTED_ADDRESSES:
        code = code.replace(address, f"127.0.0.1:{cluster.port}")
    env = dict(cluster.env)
    if block.lang in docs.SHELL:
        argv = ["bash", "-e", "-o", "pipefail", "-c", code]
    else:
        env.update(config.read_env_file(cluster.env_file))
        argv = [sys.executable, "-c", code]
    return subprocess.run(
        argv,
        cwd=docs.ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_every_block_runs_here_or_says_why_not() -> None:
    """A block is run, shown (text, yaml that parses) or marked with a reason; no fence
    without a language, so no block drifts out of the test unnoticed."""
    problems = []
    for block in ALL:
        if block.lang not in docs.RUNNABLE | docs.SHOWN:
            problems.append(f"{block.id}: language {block.lang!r}: use sh, python, yaml or text")
        elif block.lang == "yaml":
            yaml.safe_load(block.code)
        if block.not_run is not None and block.lang not in docs.RUNNABLE:
            problems.append(f"{block.id}: a {block.lang} block is never run; drop its marker")
    assert not problems, "\n".join(problems)
    assert len(RUN) >= 10, [b.id for b in RUN]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_block_runs_against_shardq_dev(block: docs.Block, cluster: docs.DevProcess) -> None:
    done = run_block(block, cluster)
    shown = (
        f"{block.id} ({block.lang}):\n{block.code}\n"
        f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    )
    assert done.returncode == 0, shown
    assert "Traceback" not in done.stderr, shown
    if block.output is not None:
        assert docs.output_matches(block.output, done.stdout), f"expected:\n{block.output}\n{shown}"


def shardq(cluster: docs.DevProcess, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``script`` in bash beside the cluster, as a reader's second terminal (``env`` added)."""
    return subprocess.run(
        ["bash", "-c", script],
        cwd=docs.ROOT,
        env={**cluster.env, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_flags_then_variables_then_the_dev_env_file(cluster: docs.DevProcess) -> None:
    """The file is the last fallback: a variable wins over it, a flag over the variable."""
    url = config.read_env_file(cluster.env_file)["SHARDQ_DATABASE_URL"]
    from_file = shardq(cluster, "shardq tokens list --json")
    assert from_file.returncode == 0, from_file.stderr
    dead_url = "postgresql://postgres@127.0.0.1:1/postgres"
    variable = shardq(cluster, "shardq tokens list", SHARDQ_DATABASE_URL=dead_url)
    assert variable.returncode == 1
    assert variable.stderr.startswith("shardq: error: database error:"), variable.stderr
    flag = shardq(cluster, f"shardq tokens list --database-url {url}", SHARDQ_DATABASE_URL=dead_url)
    assert flag.returncode == 0, flag.stderr


def test_a_reader_that_stops_early_ends_the_listing_quietly(cluster: docs.DevProcess) -> None:
    """``shardq jobs list ... | head -1`` with more rows than a pipe holds: no traceback."""
    submit = (
        "import os\n"
        "from shardq import Client, JobRequest\n"
        "with Client(os.environ['SHARDQ_COORDINATOR'], os.environ['SHARDQ_TOKEN']) as c:\n"
        "    c.submit_many([JobRequest('echo', {'i': i}, delay=3600) for i in range(1000)])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", submit],
        env={**cluster.env, **config.read_env_file(cluster.env_file)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    piped = shardq(
        cluster,
        "shardq jobs list --state scheduled --page-size 1000 | head -1; "
        'echo "exit ${PIPESTATUS[0]}"',
    )
    assert piped.stdout.splitlines()[0].startswith("JOB_ID"), piped.stdout
    assert piped.stdout.splitlines()[-1] == "exit 141", piped.stdout
    assert piped.stderr == "", piped.stderr
    # The same, deterministically: the reader is gone before the first write.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        closed = subprocess.run(
            [str(docs.VENV_BIN / "shardq"), "jobs", "list", "--state", "scheduled"],
            env=cluster.env,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (closed.returncode, closed.stderr) == (141, "")


def test_the_python_snippet_shardq_dev_prints_runs(cluster: docs.DevProcess) -> None:
    """The ready text's "From Python:" lines, copied as printed, print the state by name."""
    text = "\n".join(cluster.lines)
    printed = text.split("From Python:\n", 1)[1].split("\n\n", 1)[0]
    code = "\n".join(line.removeprefix("  ") for line in printed.splitlines())
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{code}\n{done.stderr}"
    assert done.stdout.startswith("SUCCEEDED {"), done.stdout
