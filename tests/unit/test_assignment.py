"""Assignment properties: shards are dealt per queue over the live workers serving it."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from shardq.coordinator.assignment import Serving, assign, deal

queue_names = st.sampled_from(["default", "reports", "email", "video.render", "q-5"])
handler_sets = st.sampled_from([frozenset({"a"}), frozenset({"a", "b"}), frozenset({"c"})])
worker_ids = st.from_regex(r"w-[a-z0-9]{1,6}", fullmatch=True)
# worker -> what it serves: 0..12 workers, each with 1..3 of the queues and a handler set.
fleets = st.dictionaries(
    worker_ids,
    st.builds(Serving, st.sets(queue_names, min_size=1, max_size=3), handler_sets),
    max_size=12,
)
shard_sets = st.sets(st.integers(0, 40), max_size=12)


def claimers(out: dict[str, dict[int, tuple[str, ...]]], shard: int, queue: str) -> list[str]:
    return [w for w, mine in out.items() if queue in mine.get(shard, ())]


@given(shard_sets, fleets)
def test_every_shard_has_a_worker_claiming_each_queue_that_anyone_serves(
    shards: set[int], fleet: dict[str, Serving]
) -> None:
    out = assign(shards, fleet)
    for queue in {q for s in fleet.values() for q in s.queues}:
        for shard in shards:
            assert claimers(out, shard, queue), f"shard {shard}: nobody claims {queue!r}"


@given(shard_sets, fleets)
def test_every_shard_has_a_worker_of_each_handler_set_of_a_queue(
    shards: set[int], fleet: dict[str, Serving]
) -> None:
    out = assign(shards, fleet)
    for queue in {q for s in fleet.values() for q in s.queues}:
        sets = {s.handlers for s in fleet.values() if queue in s.queues}
        for shard in shards:
            there = {fleet[w].handlers for w in claimers(out, shard, queue)}
            assert there == sets, f"shard {shard}, queue {queue!r}: {there} of {sets}"


@given(shard_sets, fleets)
def test_a_worker_gets_only_shards_where_it_claims_its_own_queues(
    shards: set[int], fleet: dict[str, Serving]
) -> None:
    out = assign(shards, fleet)
    assert set(out) == set(fleet)
    for worker, mine in out.items():
        assert set(mine) <= shards
        for queues in mine.values():
            assert queues, f"{worker} got a shard with no queue to claim there"
            assert set(queues) <= set(fleet[worker].queues)
            assert list(queues) == sorted(queues)


@given(shard_sets.filter(bool), fleets)
def test_every_worker_gets_a_shard_for_each_of_its_queues(
    shards: set[int], fleet: dict[str, Serving]
) -> None:
    out = assign(shards, fleet)
    for worker, serving in fleet.items():
        claimed = {q for qs in out[worker].values() for q in qs}
        assert claimed == set(serving.queues)


@given(shard_sets, fleets, st.randoms())
def test_every_replica_computes_the_same_assignment_whatever_the_order(
    shards: set[int], fleet: dict[str, Serving], rng: random.Random
) -> None:
    items = list(fleet.items())
    rng.shuffle(items)
    shuffled_shards = list(shards)
    rng.shuffle(shuffled_shards)
    assert assign(shuffled_shards, dict(items)) == assign(shards, fleet)


@given(shard_sets.filter(bool), st.sets(worker_ids))
def test_one_queue_is_dealt_evenly_as_before_queues(shards: set[int], workers: set[str]) -> None:
    out = assign(shards, dict.fromkeys(workers, Serving(["default"])))
    as_before = deal(shards, workers)
    assert {w: sorted(m) for w, m in out.items()} == {w: sorted(s) for w, s in as_before.items()}
    if len(workers) >= len(shards):
        assert all(len(m) == 1 for m in out.values())
    elif workers:
        sizes = Counter(len(m) for m in out.values())
        assert max(sizes) - min(sizes) <= 1


def test_disjoint_groups_never_share_a_queue_on_any_shard() -> None:
    fleet = {
        "fast-1": Serving(["default"], {"email.send"}),
        "fast-2": Serving(["default"], {"email.send"}),
        "reports-1": Serving(["reports"], {"report.build"}),
    }
    out = assign(range(4), fleet)
    assert out["fast-1"] == {0: ("default",), 2: ("default",)}
    assert out["fast-2"] == {1: ("default",), 3: ("default",)}
    # The one reports worker claims reports on every shard, and nothing else.
    assert out["reports-1"] == {s: ("reports",) for s in range(4)}


def test_a_worker_of_two_queues_claims_both_on_the_same_shards_when_its_peers_do_too() -> None:
    fleet = {"a": Serving(["default", "email"]), "b": Serving(["email", "default"])}
    out = assign(range(4), fleet)
    assert out["a"] == {0: ("default", "email"), 2: ("default", "email")}
    assert out["b"] == {1: ("default", "email"), 3: ("default", "email")}


def test_workers_of_one_queue_with_other_handlers_each_cover_every_shard() -> None:
    # A rolling deploy: the new pods have one handler more than the old ones.
    old, new = {"echo"}, {"echo", "email.send"}
    fleet = {"old-1": Serving(["default"], old), "old-2": Serving(["default"], old)}
    fleet["new-1"] = Serving(["default"], new)
    out = assign(range(2), fleet)
    assert out["old-1"] == {0: ("default",)} and out["old-2"] == {1: ("default",)}
    assert out["new-1"] == {0: ("default",), 1: ("default",)}


def test_no_shards_or_no_workers_assign_nothing() -> None:
    assert assign([], {"a": Serving(["default"])}) == {"a": {}}
    assert assign(range(3), {}) == {}
