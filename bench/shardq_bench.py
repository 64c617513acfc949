"""shardq's side of the benchmark — A STUB until the shardq worker exists.

!!! NOT A MEASUREMENT: every request is answered with ``{"skipped": ...}`` and ``run.py``
!!! reports shardq as "pending". Replace this file's body when the worker lands.

The protocol (the same as ``bench/peers/*_bench.py``; see ``bench/peers/_common.py``)
--------------------------------------------------------------------------------------
``run.py`` starts this script as a fresh process per request, with the project's Python
(``--shardq-python``, default ``.venv/bin/python`` at the repository root), writes ONE JSON
object to its stdin, and reads the LAST line of its stdout as ONE JSON object. Logs go to
stderr (its tail is kept when the process fails). Exit status 0, or the run counts as an error.

1. ``{"op": "describe"}`` →
   ``{"system": "shardq", "versions": {name: version, ...},
      "needs": ["redis", "postgres"],
      "scenarios": {name: "supported" | "unsupported: <why>", ...},
      "skipped": "<why>"}``            (``skipped`` only while nothing can be measured)
   ``run.py`` starts PostgreSQL only when a system that is not skipped needs it.

2. ``{"op": "run", "scenario": NAME, "params": {...}, "redis_url": "redis://127.0.0.1:P/0",
      "redis_urls": [one URL per shard, multishard scenario only: several DBs or servers],
      "postgres_url": "postgresql://postgres@127.0.0.1:P/postgres" or null,
      "workdir": "<empty directory for this run's files>", "repeat": K, "quick": bool}`` →
   ``{"system": "shardq", "scenario": NAME, "versions": {...},
      "metrics": {figure: number, ...},        # the figures below, same names as the peers
      "config": {"params": ..., "concurrency": {"processes": N, "how": "<stated config>"},
                 ...anything else that describes the run...}}``
   or ``{"skipped": "<why>"}`` / ``{"unsupported": "<why>"}`` (never a made-up number).
   Redis is FLUSHALLed before every run; the database is the run's to create tables in
   (``shardq migrate``) and is not cleaned: drop what you create, or use a fresh schema.

Figures each scenario must return (``run.py`` aggregates median / min–max over repeats):

- ``submit``: ``single_jobs_per_s`` (one producer, one unary SubmitJob at a time; add
  ``unary_64_in_flight_jobs_per_s`` if measured) and ``batch_jobs_per_s`` (SubmitJobs of
  ``params.batch_size``); params ``n_single``, ``n_batch``, ``batch_size``.
- ``drain``: ``jobs_per_s``, ``drain_s`` (first job start → last job start, ``params.n``
  no-op jobs queued before the workers start), ``launch_to_first_start_s``. 2 worker
  processes (say so in ``config.concurrency``). "Done" for shardq should mean the result row
  is in Postgres: measure to the last result row, and say which in ``config``.
- ``latency``: ``p50_ms``, ``p99_ms``, ``max_ms`` of start − submit, one job at a time on an
  idle system, ``params.n`` samples with a random idle gap in [gap_min_s, gap_max_s].
- ``delayed``: ``p50_ms``, ``p99_ms``, ``max_ms``, ``min_ms``, ``early_jobs`` of
  start − run_at for ``params.n`` jobs due at ``params.due_per_s`` starting ``lead_s`` after
  submission begins.
- ``fairness``: ``b_wait_p50_ms``, ``b_wait_p99_ms``, ``b_wait_max_ms``, the same for
  ``a_wait_*``, ``b_p99_over_a_p99`` and ``flood_drain_s``: tenant A's ``n_a`` jobs are
  queued BEFORE the workers start; from the first job start on, tenant B submits ``n_b``
  jobs ``b_gap_s`` apart. B's wait = start − submit; A's = start − max(submit, first start).
  Use shardq's tenants here (A and B are two tenants), not one queue.
- ``scale`` (shardq only): e.g. ``claim_us_empty``, ``claim_us_loaded``,
  ``promote_us_empty``, ``promote_us_loaded``, ``redis_bytes_per_scheduled_job`` with
  ``params.scheduled`` jobs on one shard.
- ``multishard`` (shardq only): ``jobs_per_s_<k>_shards`` for each k in ``params.shards``.

Job start times must be taken where the job starts (in the worker, first thing in the
handler), e.g. with ``bench/peers/_common.record_start`` into ``BENCH_STARTS_FILE``.
"""

from __future__ import annotations

import json
import sys

SKIPPED = "shardq worker not built yet"
SCENARIOS = ["submit", "drain", "latency", "delayed", "fairness", "scale", "multishard"]


def main() -> None:
    request = json.loads(sys.stdin.read() or "{}")
    if request.get("op") == "describe":
        answer = {
            "system": "shardq",
            "versions": {"shardq": "stub", "python": sys.version.split()[0]},
            "needs": ["redis", "postgres"],
            "scenarios": dict.fromkeys(SCENARIOS, "supported"),
            "skipped": SKIPPED,
        }
    else:
        answer = {"system": "shardq", "scenario": request.get("scenario"), "skipped": SKIPPED}
    sys.stdout.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
