"""The coordinator's own Python per job of a ``SubmitJobs`` of 100, stage by stage, in process.

    python bench/submit_stages.py [--rounds 5] [--out FILE.json]
    python bench/submit_stages.py --shardq-python /tmp/base/.venv/bin/python ...

Each stage is the coordinator's own function on the jobs of one 100-job request, as the
client library builds it (``job_spec``): reading the specs into ``NewJob``s
(``convert.new_job``, with its payload check), ``ShardClient.prepare``, the per-job ARGV, the
``EVALSHA``'s packing (hiredis), reading ``enqueue.lua``'s reply, and the answer's items.
No server, no Redis, no gRPC: what is left of a call's CPU (grpcio, asyncio, redis-py, the
Redis round trip) is measured by ``bench/run.py``'s ``submit``. The best of ``--rounds``
rounds of 300 requests each, in µs per job; the client's ``job_spec`` is timed too (the
producer's side of the same request), and apart from the total, a unary ``SubmitJob``'s
answer for a job it made (``unary_answer``, one per call).

``--shardq-python``: run with another checkout's venv (its shardq), to compare two commits;
the JSON records the commit of the shardq measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from enqueue_calls import parse_args, report_head  # noqa: E402
from redis.asyncio import Redis  # noqa: E402

from shardq.client import job_spec  # noqa: E402
from shardq.common.redis import _HiredisPacking  # noqa: E402
from shardq.coordinator import api, convert  # noqa: E402
from shardq.coordinator.router import Submitted  # noqa: E402
from shardq.shard import records  # noqa: E402
from shardq.shard.client import ShardClient  # noqa: E402
from shardq.shard.codes import ItemCode  # noqa: E402
from shardq.shard.models import TenantLimits  # noqa: E402
from shardq.shard.records import EnqueueResult, JobRecord  # noqa: E402
from shardq.v1 import jobs_pb2  # noqa: E402

BATCH = 100
CALLS = 300


def _answer(outcomes: list[Any]) -> Callable[[], Any]:
    """The SubmitJobs answer of ``outcomes`` as this checkout builds it, with what it counts
    for the metrics (before ``_Answer``, ``_submit_jobs_response`` built it and the metrics
    then read its items; before that, commits built each item with ``_item`` and copied it)."""
    answer = getattr(api, "_Answer", None)
    if answer is not None:

        def build_answer() -> Any:
            a = answer()
            a.add(outcomes)
            return a.response

        return build_answer
    build = getattr(api, "_submit_jobs_response", None)
    if build is not None:
        return lambda: build(outcomes)
    item: Any = getattr(api, "_item")  # noqa: B009 - absent from this checkout's stubs
    return lambda: jobs_pb2.SubmitJobsResponse(
        items=[item(i, o.job.request_id, o.result) for i, o in enumerate(outcomes)]
    )


def _unary_answers(outcomes: list[Any]) -> Callable[[], Any]:
    """A unary SubmitJob's answer for each of ``outcomes`` (each a job it made), as this
    checkout builds it (before ``convert.new_job_into``, through the job's record)."""
    into = getattr(convert, "new_job_into", None)
    if into is not None:

        def answers() -> list[Any]:
            out = []
            for o in outcomes:
                response = jobs_pb2.SubmitJobResponse()
                into(response.job, o.job, o.result, o.shard_id)
                out.append(response)
            return out

        return answers
    return lambda: [
        jobs_pb2.SubmitJobResponse(
            job=convert.job_to_pb(JobRecord.of_new(o.job, o.result), o.shard_id),
            deduplicated=o.result.deduplicated,
        )
        for o in outcomes
    ]


def _reply_reader(prepared: list[Any], now: int) -> Callable[[], list[Any]]:
    """Reading ``enqueue.lua``'s reply for ``prepared``, each a job made ready, as this
    checkout's script answers it: one flat list (the shard's now, then three entries a job),
    or before that, a list of six values per job."""
    if hasattr(records, "ENQUEUE_REPLY_STRIDE"):
        flat: list[Any] = [now]
        for j in prepared:
            flat += [int(ItemCode.OK), j.job_id.encode(), now]
        return lambda: EnqueueResult.from_reply(flat)
    rows = [[int(ItemCode.OK), j.job_id.encode(), b"ready", 0, now, now] for j in prepared]
    return lambda: [EnqueueResult.from_reply(r) for r in rows]


def stages() -> dict[str, Callable[[], Any]]:
    """Each stage on one request's 100 jobs, its inputs made by the stage before."""
    specs = list(
        jobs_pb2.SubmitJobsRequest(
            tenant_id="bench", jobs=[job_spec("bench.noop", i) for i in range(BATCH)]
        ).jobs
    )
    limits = TenantLimits()
    client = ShardClient(Redis())  # never connects: prepare and the records need no server
    now = client.clock.now_ms()

    def new_jobs() -> list[Any]:
        return [convert.new_job("bench", s, s.request_id, limits, 1 << 20) for s in specs]

    made = new_jobs()

    def prepare() -> list[Any]:
        return [client.prepare(j, now) for j in made]

    prepared = prepare()

    def argv() -> list[Any]:
        args: list[Any] = [now, 86_400_000, 1]
        for job in prepared:
            args.extend(job.to_argv())
        return args

    args = argv()
    packer = _HiredisPacking.__new__(_HiredisPacking)  # pack_command uses no instance state
    read_reply = _reply_reader(prepared, now)
    results = read_reply()
    outcomes = [Submitted(j, r, 0) for j, r in zip(prepared, results, strict=True)]
    return {
        "new_job": new_jobs,
        "prepare": prepare,
        "to_argv": argv,
        "pack": lambda: packer.pack_command("EVALSHA", "0" * 40, 0, *args),
        "from_reply": read_reply,
        "submitted": lambda: [Submitted(j, r, 0) for j, r in zip(prepared, results, strict=True)],
        "answer": _answer(outcomes),
        # Not a SubmitJobs stage: a unary SubmitJob's answer, per job (one per call).
        "unary_answer": _unary_answers(outcomes),
    }


def measure(rounds: int) -> dict[str, float]:
    def per_job(fn: Callable[[], Any]) -> float:
        return min(timeit.repeat(fn, number=CALLS, repeat=rounds)) / CALLS / BATCH * 1e6

    out = {name: round(per_job(fn), 3) for name, fn in stages().items()}
    out["coordinator_total"] = round(sum(v for k, v in out.items() if k != "unary_answer"), 3)
    out["client_job_spec"] = round(
        per_job(lambda: [job_spec("bench.noop", i) for i in range(BATCH)]), 3
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds per stage (best kept)")
    a = parse_args(ap)
    report: dict[str, Any] = {
        **report_head("shardq-submit-stages/1", "bench/submit_stages.py"),
        "params": {"batch": BATCH, "calls_per_round": CALLS, "rounds": a.rounds},
        "unit": "µs per job, best round",
        "results": measure(a.rounds),
    }
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    for name, us in report["results"].items():
        print(f"{name:18} {us:7.2f} µs/job")


if __name__ == "__main__":
    main()
