"""Retry policies: exponential ceilings with a cap, their wire form, a job's policy checked.

The waits themselves (jitter below the ceiling, precedence of the job's policy) are computed
by fail.lua alone: tests/integration/test_lua_fail.py."""

from __future__ import annotations

import pytest

from shardq.common.errors import InvalidArgument
from shardq.shard.backoff import MAX_WAIT_MS, Backoff, job_backoff


@pytest.mark.parametrize(
    ("attempt", "ceiling"),
    [(1, 1_000), (2, 2_000), (3, 4_000), (4, 8_000), (12, 2_048_000), (13, 3_600_000)],
)
def test_the_ceiling_doubles_with_each_attempt_until_the_cap(attempt: int, ceiling: int) -> None:
    assert Backoff().ceiling_ms(attempt) == ceiling


def test_the_ceiling_never_shrinks_and_never_passes_the_cap() -> None:
    b = Backoff(base_ms=250, cap_ms=60_000)
    ceilings = [b.ceiling_ms(a) for a in range(1, 100)]
    assert ceilings == sorted(ceilings)
    assert max(ceilings) == 60_000


@pytest.mark.parametrize("attempt", [41, 1_000, 10**9, 2**62])
def test_a_huge_attempt_is_capped_without_building_a_huge_number(attempt: int) -> None:
    assert Backoff().ceiling_ms(attempt) == 3_600_000
    assert Backoff(base_ms=1, cap_ms=2**60).ceiling_ms(attempt) == 2**40


@pytest.mark.parametrize("attempt", [0, -1, -(10**9)])
def test_attempts_are_one_based(attempt: int) -> None:
    with pytest.raises(ValueError, match="1-based"):
        Backoff().ceiling_ms(attempt)


@pytest.mark.parametrize(
    "policy", [Backoff(), Backoff(250, 60_000, 0.5), Backoff(5_000, 0, 0.0), Backoff(1, 2, 0.1)]
)
def test_the_wire_form_reads_back_exactly(policy: Backoff) -> None:
    assert Backoff.parse(policy.to_arg()) == policy
    assert Backoff.parse(policy.to_arg().encode()) == policy


def test_the_server_default_is_one_second_doubling_to_an_hour_with_full_jitter() -> None:
    assert Backoff().to_arg() == "1000 3600000 1.0"
    assert Backoff.parse("") is None and Backoff.parse(None) is None


def test_a_job_policy_of_zeros_is_no_policy() -> None:
    assert job_backoff(0, 0, 0.0) is None
    assert job_backoff(5_000, 0, 0.0) == Backoff(5_000, 0, 0.0)
    assert job_backoff(0, 0, 0.5) == Backoff(0, 0, 0.5)
    assert job_backoff(1, MAX_WAIT_MS, 1.0) == Backoff(1, MAX_WAIT_MS, 1.0)


@pytest.mark.parametrize(
    ("base", "cap", "jitter", "field"),
    [
        (-1, 0, 0.0, "job.retry.base_ms"),
        (MAX_WAIT_MS + 1, 0, 0.0, "job.retry.base_ms"),
        (0, -5, 0.0, "job.retry.max_ms"),
        (2_000, 1_000, 0.0, "job.retry.max_ms"),
        (0, 0, 1.5, "job.retry.jitter"),
        (0, 0, -0.1, "job.retry.jitter"),
        (0, 0, float("nan"), "job.retry.jitter"),
        (0, 0, float("inf"), "job.retry.jitter"),
    ],
)
def test_a_bad_job_policy_names_its_field(base: int, cap: int, jitter: float, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        job_backoff(base, cap, jitter, "job.retry")
    assert err.value.field == field
