"""The scenarios, written once against a small adapter that each peer implements.

Standard library only (runs inside every peer's venv). Each function takes the request
(``{"scenario", "params", "redis_url", "workdir", ...}``) and an adapter, and returns
``{"metrics": {...}, "config": {...}}``.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from _common import (
    CPU_GROUPS,
    TENANT_B_BASE,
    CpuMeter,
    Workers,
    count_starts,
    cpu_per_job_us,
    duplicate_starts,
    fairness_metrics,
    log,
    read_starts,
    summary_ms,
    wait_first_start,
    wait_for_starts,
    worker_env,
)

WARMUP_BASE = 2_000_000_000
DEFAULT_TUNING = "tuned"
#: What shardq's tuning is, which each peer's ``tuned`` knobs are the equivalent of.
SHARDQ_KNOBS = (
    "shardq-worker --concurrency 200 (default 16): jobs in flight per worker process; a "
    "claim takes up to 100 jobs (bounded by free slots), results are written and acked in "
    "batches of up to 500"
)
#: The two processes every peer's run has besides its workers: the one Redis server all
#: systems use (fresh per run), and this driver (the producer; it reads the start records).
SHARED_PROCESSES: list[dict[str, Any]] = [
    {"process": "redis-server", "count": 1, "role": "the broker: queues, messages, schedules"},
    {"process": "bench driver", "count": 1,
     "role": "the producer: submits every job; reads the start records (not a worker)"},
]  # fmt: skip


class Peer(Protocol):
    name: str
    concurrency: dict[str, Any]  # stated in every result: how the workers run
    #: Stated in every result: the knobs the workers run with, next to the library's own
    #: defaults (``variant``: the tuning asked for, or None for a peer without knobs).
    tuning: dict[str, Any]
    #: Every process of the run, the workers' children included (``SHARED_PROCESSES`` last).
    processes_all: list[dict[str, Any]]
    bulk_api: str | None  # the bulk submit call, where the library has one
    delay_api: str

    def submit(self, number: int) -> None: ...
    def submit_many(self, numbers: Sequence[int]) -> None: ...
    def submit_at(self, number: int, run_at: float) -> None: ...
    def worker_commands(self) -> list[list[str]]: ...
    def worker_extra_env(self) -> dict[str, str]: ...
    def close(self) -> None: ...


def _workers(req: dict[str, Any], peer: Peer) -> Workers:
    here = os.path.dirname(os.path.abspath(__file__))
    env = worker_env(_starts(req), peer.worker_extra_env())
    return Workers(peer.worker_commands(), env, here, req["workdir"])


def _starts(req: dict[str, Any]) -> str:
    return os.path.join(req["workdir"], "starts.log")


def _config(req: dict[str, Any], peer: Peer, **extra: Any) -> dict[str, Any]:
    return {
        "params": req["params"],
        "concurrency": peer.concurrency,
        "tuning": peer.tuning,
        "processes_all": peer.processes_all,
        **extra,
    }


def pick_tuning(
    req: dict[str, Any], tunings: dict[str, dict[str, Any]], defaults_note: str
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(variant, its knobs, the ``tuning`` statement) for the request's ``tuning``.

    ``tunings`` has a ``defaults`` entry (the library's own settings) and a ``tuned`` one
    (its equivalent of shardq's tuned worker); a request without ``tuning`` gets ``tuned``.
    """
    variant = req.get("tuning") or DEFAULT_TUNING
    if variant not in tunings:
        raise ValueError(f"unknown tuning {variant!r}; this peer has {sorted(tunings)}")
    knobs = tunings[variant]
    statement = {
        "variant": variant,
        "knobs": knobs,
        "library_defaults": tunings["defaults"],
        "tuned_is_equivalent_of": SHARDQ_KNOBS,
        "note": defaults_note,
    }
    return variant, knobs, statement


def _wait_all(req: dict[str, Any], workers: Workers, total: int, timeout: float) -> None:
    path = _starts(req)
    deadline = time.monotonic() + timeout
    while count_starts(path) < total:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {count_starts(path)}/{total} jobs started in {timeout}s")
        workers.check_alive()
        time.sleep(0.02)


def _warm_up(req: dict[str, Any], peer: Peer, workers: Workers) -> int:
    """Run a few jobs so every worker process is up; return the start-record count after."""
    count = 4
    for k in range(count):
        peer.submit(WARMUP_BASE + k)
    _wait_all(req, workers, count, timeout=120)
    time.sleep(0.3)  # let the pools settle back to idle
    return count_starts(_starts(req))


def _timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def submit(req: dict[str, Any], peer: Peer) -> dict[str, Any]:
    """Jobs/s accepted from one producer: single calls, then the bulk API in batches."""
    p = req["params"]
    n_single, n_batch, size = p["n_single"], p["n_batch"], p["batch_size"]

    def singles() -> None:
        for i in range(n_single):
            peer.submit(i)

    metrics = {"single_jobs_per_s": round(n_single / _timed(singles), 1)}
    if peer.bulk_api:

        def batches() -> None:
            for lo in range(0, n_batch, size):
                peer.submit_many(range(n_single + lo, n_single + min(lo + size, n_batch)))

        metrics["batch_jobs_per_s"] = round(n_batch / _timed(batches), 1)
    return {
        "metrics": metrics,
        "config": _config(
            req,
            peer,
            producer="one process, one call at a time, no workers running",
            bulk_api=peer.bulk_api or "none (batch figure not reported)",
        ),
    }


def _submit_all(peer: Peer, numbers: Sequence[int], size: int) -> list[float]:
    """Enqueue with the bulk API where there is one; return each job's submit time."""
    times: list[float] = []
    if peer.bulk_api:
        for lo in range(0, len(numbers), size):
            chunk = numbers[lo : lo + size]
            times.extend([time.time()] * len(chunk))
            peer.submit_many(chunk)
    else:
        for number in numbers:
            times.append(time.time())
            peer.submit(number)
    return times


def drain(req: dict[str, Any], peer: Peer) -> dict[str, Any]:
    """N no-op jobs already queued; start the workers; rate from the first start to the last."""
    p = req["params"]
    n = p["n"]
    _submit_all(peer, range(n), p["batch_size"])
    launched = time.time()
    with _workers(req, peer) as workers:
        meter = CpuMeter({"workers": [w.pid for w in workers.procs]}, [req["redis_url"]])
        wait_first_start(_starts(req), workers.check_alive, p["timeout_s"])
        cpu_before = meter.mark()
        _wait_all(req, workers, n, timeout=p["timeout_s"])
        cpu = cpu_per_job_us(cpu_before, meter.mark(), n)
        starts = read_starts(_starts(req))
    stamps = sorted(starts.values())
    span = stamps[-1] - stamps[0]
    return {
        "metrics": {
            "jobs_per_s": round((n - 1) / span, 1),
            "drain_s": round(span, 3),
            "launch_to_first_start_s": round(stamps[0] - launched, 3),
            **cpu,
        },
        "config": _config(
            req,
            peer,
            queued_with=peer.bulk_api or "single submit calls",
            duplicates=duplicate_starts(_starts(req)),
            cpu="cpu_us_per_job_*: CPU seconds (utime + stime, /proc) from the first job start "
            "to the last, per job: workers (each worker command with its children), "
            + "; ".join(f"{k}: {v}" for k, v in CPU_GROUPS.items() if k != "postgres"),
        ),
    }


def latency(req: dict[str, Any], peer: Peer) -> dict[str, Any]:
    """Idle workers; one job at a time; start - submit for each."""
    p = req["params"]
    n = p["n"]
    path = _starts(req)
    submitted: dict[int, float] = {}
    with _workers(req, peer) as workers:
        seen = _warm_up(req, peer, workers)
        rng = random.Random(7)
        for i in range(n):
            time.sleep(rng.uniform(p["gap_min_s"], p["gap_max_s"]))
            submitted[i] = time.time()
            peer.submit(i)
            seen += 1
            if wait_for_starts(path, seen, timeout=30, poll=0.001) < seen:
                workers.check_alive()
                raise RuntimeError(f"job {i} did not start within 30 s")
        starts = read_starts(path)
    waits = [starts[i] - submitted[i] for i in range(n)]
    return {
        "metrics": summary_ms(waits),
        "config": _config(req, peer, submit="one job, wait until it starts, idle gap, repeat"),
    }


def delayed(req: dict[str, Any], peer: Peer) -> dict[str, Any]:
    """N jobs due at `rate` per second, all submitted ahead; lateness = start - run_at."""
    p = req["params"]
    n, rate = p["n"], p["due_per_s"]
    path = _starts(req)
    with _workers(req, peer) as workers:
        _warm_up(req, peer, workers)
        base = time.time() + p["lead_s"]
        run_at = {i: base + i / rate for i in range(n)}
        late_submits = 0
        t0 = time.perf_counter()
        for i in range(n):
            peer.submit_at(i, run_at[i])
            if time.time() > run_at[i]:
                late_submits += 1
        submit_s = time.perf_counter() - t0
        _wait_all(req, workers, n + 4, timeout=p["lead_s"] + n / rate + p["timeout_s"])
        time.sleep(0.2)
        starts = read_starts(path)
    lateness = [starts[i] - run_at[i] for i in range(n)]
    metrics = summary_ms(lateness)
    metrics["early_jobs"] = sum(1 for x in lateness if x < 0)
    metrics["min_ms"] = round(min(lateness) * 1000, 3)
    if late_submits:
        log(f"warning: {late_submits} jobs were submitted after their run_at (raise lead_s)")
    return {
        "metrics": metrics,
        "config": _config(
            req,
            peer,
            delay_api=peer.delay_api,
            submit_s=round(submit_s, 3),
            submitted_after_run_at=late_submits,
            duplicates=duplicate_starts(path),
        ),
    }


def fairness(req: dict[str, Any], peer: Peer) -> dict[str, Any]:
    """Tenant A's flood is queued; the workers start; tenant B submits a few. One queue.

    The flood is queued before the workers start so that every system faces the same backlog
    of ``n_a`` jobs, whatever its producer's speed (submitted one by one while the workers ran,
    a flood never builds a backlog on a system that drains faster than one producer submits).
    Waits count from when the system started serving (its first job start) for A's jobs, and
    from submission for B's, which are submitted ``b_gap_s`` apart once serving has begun.
    """
    p = req["params"]
    n_a, n_b = p["n_a"], p["n_b"]
    path = _starts(req)
    a_times = _submit_all(peer, range(n_a), p["batch_size"])
    with _workers(req, peer) as workers:
        _wait_all(req, workers, 1, timeout=120)
        b_times: list[float] = []
        for k in range(n_b):
            b_times.append(time.time())
            peer.submit(TENANT_B_BASE + k)
            time.sleep(p["b_gap_s"])
        _wait_all(req, workers, n_a + n_b, timeout=p["timeout_s"])
        starts = read_starts(path)
    metrics = fairness_metrics(starts, a_times, b_times)
    return {
        "metrics": metrics,
        "config": _config(
            req,
            peer,
            queues="one queue for both tenants (the library has no per-tenant fairness)",
            a_submitted_with=(peer.bulk_api or "single submit calls") + ", before workers start",
            b_submitted="single calls, b_gap_s apart, from the first job start on",
            duplicates=duplicate_starts(path),
        ),
    }


SCENARIOS: dict[str, Callable[[dict[str, Any], Peer], dict[str, Any]]] = {
    "submit": submit,
    "drain": drain,
    "latency": latency,
    "delayed": delayed,
    "fairness": fairness,
}
SHARDQ_ONLY = {
    "scale": "shardq-only scenario (1,000,000 scheduled jobs on one shard)",
    "multishard": "shardq-only scenario (throughput vs number of Redis shards)",
    "fairness_priority": "shardq-only scenario (the peers have no tenants: their fairness "
    "scenario is already A's flood ahead of B in one FIFO queue)",
}


def serve_peer(
    make_peer: Callable[[dict[str, Any]], Peer],
    name: str,
    versions: dict[str, str],
    tunings: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Entry point of a peer driver: wire the adapter into the JSON protocol. ``tunings``:
    the peer's knobs by variant (``defaults``, ``tuned``); None for a peer without any."""
    from _common import serve  # noqa: PLC0415

    def bind(
        fn: Callable[[dict[str, Any], Peer], dict[str, Any]],
    ) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def run(req: dict[str, Any]) -> dict[str, Any]:
            peer = make_peer(req)
            try:
                return fn(req, peer)
            finally:
                peer.close()

        return run

    table: dict[str, Any] = {k: bind(v) for k, v in SCENARIOS.items()}
    table.update(SHARDQ_ONLY)
    serve(name, versions, table, described={"tunings": tunings or {}})
