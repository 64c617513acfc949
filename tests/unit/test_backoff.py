"""Retry delays: exponential ceilings with a cap, full jitter below the ceiling."""

from __future__ import annotations

import random

import pytest

from shardq.shard.backoff import Backoff


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
    assert 0 <= Backoff().delay_ms(attempt, random.Random(1)) <= 3_600_000


@pytest.mark.parametrize("attempt", [0, -1, -(10**9)])
def test_attempts_are_one_based(attempt: int) -> None:
    with pytest.raises(ValueError, match="1-based"):
        Backoff().ceiling_ms(attempt)
    with pytest.raises(ValueError, match="1-based"):
        Backoff().delay_ms(attempt, random.Random(1))


@pytest.mark.parametrize("attempt", [1, 2, 5, 13, 30])
def test_the_delay_is_drawn_from_zero_to_the_ceiling(attempt: int) -> None:
    b = Backoff()
    rng = random.Random(42)
    delays = [b.delay_ms(attempt, rng) for _ in range(2_000)]
    ceiling = b.ceiling_ms(attempt)
    assert all(0 <= d <= ceiling for d in delays)
    # Full jitter spreads retries over the whole range, not near the ceiling only.
    assert min(delays) < ceiling * 0.05
    assert max(delays) > ceiling * 0.95


def test_the_same_seed_gives_the_same_delays() -> None:
    b = Backoff()
    rng1, rng2 = random.Random(7), random.Random(7)
    assert [b.delay_ms(3, rng1) for _ in range(20)] == [b.delay_ms(3, rng2) for _ in range(20)]


def test_a_zero_base_means_retry_at_once() -> None:
    assert Backoff(base_ms=0).delay_ms(5, random.Random(3)) == 0
