"""The reconciliation's verdicts (shardq.coordinator.tools.reconcile), one store state each:
what the chaos tests and ``shardq soak`` would report, and whether it is ok."""

from __future__ import annotations

from collections import Counter

import pytest

from shardq.coordinator.tools.reconcile import (
    Accepted,
    Key,
    RedisJob,
    RowInfo,
    Snapshot,
    reconcile,
    settled,
)

K: Key = ("acme", "r1")


def accepted(job_id: str = "J1") -> Accepted:
    a = Accepted()
    a.add(*K, job_id)
    return a


def snap(
    row: str | None = "succeeded",
    redis: list[tuple[str, str, bool]] | None = None,
    effects: int | None = 1,
    row_job: str = "J1",
    rows: int = 1,
) -> Snapshot:
    """A store state of job K: its row's status, its hashes (job ID, state, on outbox)."""
    s = Snapshot(side_effects=None if effects is None else Counter({K: effects} if effects else {}))
    if row is not None:
        s.rows[K] = RowInfo(row, row_job, "ledger", 1)
        s.row_counts[K] = rows
    hashes = [("J1", row or "active", False)] if redis is None else redis
    s.jobs[K] = [RedisJob(j, "127.0.0.1:1", state, out) for j, state, out in hashes]
    return s


CASES = {
    "final and agreeing": (snap(), None),
    "final, its hash expired": (snap(redis=[]), None),
    "no row, no hash": (snap(row=None, redis=[]), "lost"),
    "no row, still running": (snap(row=None, effects=0), "stuck"),
    "dead in Redis, on the outbox": (snap(row=None, redis=[("J1", "dead", True)]), "stuck"),
    "row written, still on the outbox": (snap(redis=[("J1", "succeeded", True)]), "stuck"),
    "a second job hash": (snap(redis=[("J1", "succeeded", False), ("J2", "succeeded", False)]),
                          "duplicate_jobs"),
    "the row names another job": (snap(row_job="J2", redis=[]), "duplicate_jobs"),
    "two rows": (snap(rows=2), "duplicate_rows"),
    "two side effects": (snap(effects=2), "duplicate_side_effects"),
    "succeeded without its side effect": (snap(effects=0), "missing_side_effects"),
    "dead with a side effect": (snap(row="dead"), "stray_side_effects"),
    "Redis says dead, the row succeeded": (snap(redis=[("J1", "dead", False)]), "disagreements"),
}  # fmt: skip


@pytest.mark.parametrize(("state", "problem"), CASES.values(), ids=CASES.keys())
def test_each_store_state_gets_its_verdict(state: Snapshot, problem: str | None) -> None:
    report = reconcile(accepted(), state, side_effect_handlers={"ledger"})
    found = {
        name
        for name in (
            "lost", "stuck", "duplicate_jobs", "duplicate_rows", "duplicate_side_effects",
            "missing_side_effects", "stray_side_effects", "disagreements",
        )
        if getattr(report, name)
    }  # fmt: skip
    assert found == ({problem} if problem else set()), report.render()
    assert report.ok is (problem is None)
    assert ("NOT OK" in report.render()) is (problem is not None)


def test_two_answers_naming_two_jobs_are_a_duplicate_job() -> None:
    a = accepted()
    a.add(*K, "J2")
    report = reconcile(a, snap(redis=[]))
    assert report.duplicate_jobs == [K] and not report.ok


def test_a_dead_job_is_a_failure_only_where_the_caller_says_it_may_not_die() -> None:
    state = snap(row="dead", redis=[("J1", "dead", False)], effects=0)
    assert reconcile(accepted(), state).ok
    assert reconcile(accepted(), state, may_die=lambda key: True).ok
    report = reconcile(accepted(), state, may_die=lambda key: False)
    assert report.unexpected_dead == [K] and not report.ok


def test_runs_are_split_by_cause_and_rows_count_redeliveries() -> None:
    state = snap()
    state.rows[K] = RowInfo("succeeded", "J1", "ledger", 3)
    report = reconcile(accepted(), state, runs={K: [1, 2, 2], ("other", "x"): [1, 2]})
    assert report.executions == 3  # runs of jobs that were not accepted are not counted
    assert report.re_executions == {"new_attempt": 1, "same_attempt": 1}
    assert report.redeliveries == 2
    assert reconcile(accepted(), state).executions is None


def test_settled_waits_for_every_row_and_for_redis_to_agree() -> None:
    assert settled(accepted(), snap())
    assert not settled(accepted(), snap(row=None))
    assert not settled(accepted(), snap(redis=[("J1", "active", False)]))
    assert not settled(accepted(), snap(redis=[("J1", "succeeded", True)]))
