"""ShardClock: when a shard's clock reaches a time, by this worker's monotonic clock; never
early, whatever the reply times and however old the bound."""

from __future__ import annotations

import pytest

from shardq.worker import shardclock
from shardq.worker.shardclock import MAX_DRIFT, ShardClock


@pytest.fixture
def mono(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    t = [0.0]
    monkeypatch.setattr(shardclock, "monotonic_ms", lambda: t[0])
    return t


def test_the_tightest_bound_wins(mono: list[float]) -> None:
    c = ShardClock()
    # The monotonic clock reads the shard's minus 10,000,000; replies take 4, 1 and 9 ms.
    for shard_now, flight in ((10_000_000, 4), (10_000_010, 1), (10_000_020, 9)):
        mono[0] = shard_now - 10_000_000 + flight
        c.observe(mono[0], shard_now)
    assert c.local_ms(10_000_100) == pytest.approx(101, abs=0.1)  # 1 ms late, not early


def test_a_bound_grows_with_its_age_by_the_largest_drift(mono: list[float]) -> None:
    c = ShardClock()
    mono[0] = 1
    c.observe(1, 0)  # bound 1 ms
    mono[0] = 60_001  # a minute on: the clocks may have drifted 30 ms apart
    assert c.bound_ms() == pytest.approx(1 + MAX_DRIFT * 60_000)
    # A fresh reply slower than the old one but tighter than the aged bound replaces it.
    c.observe(60_001, 59_990)
    assert c.bound_ms() == pytest.approx(11)


def test_a_looser_bound_does_not_replace_a_tighter_one(mono: list[float]) -> None:
    c = ShardClock()
    mono[0] = 2
    c.observe(2, 0)
    mono[0] = 109
    c.observe(109, 100)
    assert c.bound_ms() == pytest.approx(2 + MAX_DRIFT * 107)


def test_no_claim_no_answer() -> None:
    with pytest.raises(RuntimeError):
        ShardClock().local_ms(1)
