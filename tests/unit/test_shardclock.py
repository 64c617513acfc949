"""ShardClock: when a shard's clock reaches a time, by this worker's monotonic clock; never
early, whatever the reply times and however old the bound."""

from __future__ import annotations

import time

import pytest

from shardq.common.loop import run_main
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


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_sleep_until_never_ends_before_its_time_on_either_loop(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvloop's timers count whole ms from the time its loop last read, so a plain sleep there
    ends up to a ms early: the worker starts a job claimed ahead on its run-at, never before.
    Waits of a fraction of a ms to a few ms, as the busy loop of a worker sees them."""
    monkeypatch.setenv("SHARDQ_EVENT_LOOP", loop)

    async def waits() -> list[float]:
        early = []
        for n in range(300):
            at = shardclock.monotonic_ms() + (n % 7) * 0.45 + 0.1
            if n % 3 == 0:
                time.sleep(0.0008)  # noqa: ASYNC251 (on purpose: the loop's time grows old)
            await shardclock.sleep_until(at)
            early.append(at - shardclock.monotonic_ms())
        return early

    early = run_main(waits())
    assert max(early) <= 0, sorted(early)[-5:]
