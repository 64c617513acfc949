"""Placement properties: slots are stable, balancing is proportional and moves the fewest slots."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardq.common.placement import DRAINING, SLOT_COUNT, slot_of
from shardq.coordinator.placement import (
    ShardInfo,
    ShardMap,
    TenantMove,
    balance_slots,
    slot_targets,
)

tenant_ids = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-",
    min_size=1,
    max_size=64,
)
# 1..12 shards with weights 1..10, keyed 0..N-1 as the shard map keys them.
weight_maps = st.lists(st.integers(1, 10), min_size=1, max_size=12).map(
    lambda ws: dict(enumerate(ws))
)

# Each example builds 16,384-slot tables (a few ms); no per-example deadline, so a busy CI
# machine cannot turn a slow example into a failure.
FULL_TABLES = settings(deadline=None)


def random_tenants(seed: int, count: int = 1_000) -> list[str]:
    rng = random.Random(seed)
    return [f"tenant-{rng.getrandbits(64):016x}" for _ in range(count)]


def expand(runs: list[tuple[int, int]]) -> list[int]:
    return [sid for sid, length in runs for _ in range(length)]


def moved(before: list[int], after: list[int]) -> list[tuple[int, int]]:
    return [(b, a) for b, a in zip(before, after, strict=True) if b != a]


def make_map(slots: list[int], **kwargs: object) -> ShardMap:
    shards = {sid: ShardInfo(sid, f"shard-{sid}:6379") for sid in set(slots)}
    return ShardMap(version=1, shards=shards, slots=tuple(slots), **kwargs)  # type: ignore[arg-type]


@given(tenant_ids)
def test_slot_of_is_stable_and_in_range(tenant: str) -> None:
    assert 0 <= slot_of(tenant) < SLOT_COUNT
    assert slot_of(tenant) == slot_of(str(tenant))


def test_slot_of_is_pinned_to_murmur3_forever() -> None:
    # Golden values: if these change, every tenant in every deployed cluster moves.
    assert [slot_of(t) for t in ("acme", "tenant-1", "a", "ü-tenant")] == [
        11472,
        6789,
        10674,
        15550,
    ]


@given(weight_maps)
@FULL_TABLES
def test_balancing_from_nothing_gives_proportional_contiguous_ranges(
    weights: dict[int, int],
) -> None:
    table = balance_slots(None, weights)
    assert len(table) == SLOT_COUNT
    total = sum(weights.values())
    counts = Counter(table)
    for sid, weight in weights.items():
        assert abs(counts[sid] - SLOT_COUNT * weight / total) < 1
    # Contiguous: shard IDs appear in one run each, in ascending order.
    runs = make_map(table).slot_ranges()
    assert [sid for _, _, sid in runs] == sorted(weights)


@given(weight_maps)
@FULL_TABLES
def test_balancing_a_balanced_table_changes_nothing(weights: dict[int, int]) -> None:
    table = balance_slots(None, weights)
    assert balance_slots(table, weights) == table


@given(weight_maps, st.integers(1, 10))
@FULL_TABLES
def test_adding_a_shard_moves_only_to_it_and_only_what_it_needs(
    weights: dict[int, int], new_weight: int
) -> None:
    before = balance_slots(None, weights)
    new_id = len(weights)
    grown = {**weights, new_id: new_weight}
    after = balance_slots(before, grown)
    changes = moved(before, after)
    targets = slot_targets(grown)
    counts = Counter(before)
    # The fewest moves any balanced table needs: each shard's excess, nothing more.
    excess = sum(max(0, c - targets[sid]) for sid, c in counts.items())
    assert len(changes) == excess
    assert Counter(after) == Counter(targets)
    # Bound from the design: about 1/(N+1) of the slots, plus one per shard for rounding.
    assert len(changes) <= math.ceil(SLOT_COUNT * new_weight / sum(grown.values())) + len(weights)
    # Slots leave only over-target shards and land only on under-target ones.
    assert all(counts[old] > targets[old] for old, _ in set(changes))
    assert all(counts[new] < targets[new] for _, new in set(changes))


@pytest.mark.parametrize("n", range(1, 9))
def test_growing_from_n_to_n_plus_one_equal_shards_moves_about_one_share(n: int) -> None:
    before = balance_slots(None, dict.fromkeys(range(n), 1))
    after = balance_slots(before, dict.fromkeys(range(n + 1), 1))
    changes = moved(before, after)
    assert len(changes) <= math.ceil(SLOT_COUNT / (n + 1)) + n
    assert {new for _, new in changes} == {n}


@pytest.mark.parametrize("seed", range(5))
def test_adding_a_fourth_shard_leaves_most_tenants_in_place(seed: int) -> None:
    before = balance_slots(None, {0: 1, 1: 1, 2: 1})
    after = balance_slots(before, {0: 1, 1: 1, 2: 1, 3: 1})
    changes = moved(before, after)
    assert abs(len(changes) - SLOT_COUNT / 4) <= 4
    assert {new for _, new in changes} == {3}
    tenants = random_tenants(seed)
    stayed = sum(before[slot_of(t)] == after[slot_of(t)] for t in tenants)
    assert stayed >= 700
    moved_to = {after[slot_of(t)] for t in tenants if before[slot_of(t)] != after[slot_of(t)]}
    assert moved_to == {3}


# Any slot table: runs of (owner, length) over shards 0..15, some of them absent from weights.
slot_tables = st.lists(
    st.tuples(st.integers(0, 15), st.integers(1, 4096)), min_size=1, max_size=24
).map(lambda runs: list(itertools.islice(itertools.cycle(expand(runs)), SLOT_COUNT)))


@given(slot_tables, weight_maps)
@settings(max_examples=50, deadline=None)
def test_balancing_any_table_hits_the_targets_with_the_fewest_moves(
    current: list[int], weights: dict[int, int]
) -> None:
    after = balance_slots(current, weights)
    targets = slot_targets(weights)
    assert Counter(after) == Counter(targets)
    # Shards absent from weights (removed) lose every slot; the rest lose only their excess.
    need = sum(
        c - targets.get(sid, 0) for sid, c in Counter(current).items() if c > targets.get(sid, 0)
    )
    assert len(moved(current, after)) == need


def test_a_zero_weight_or_draining_shard_gives_up_all_its_slots() -> None:
    before = balance_slots(None, {0: 1, 1: 1, 2: 1})
    after = balance_slots(before, {0: 1, 1: 0, 2: 1})
    assert 1 not in after
    assert {old for old, _ in moved(before, after)} == {1}
    shards = {
        0: ShardInfo(0, "a:1"),
        1: ShardInfo(1, "b:1", state=DRAINING),
        2: ShardInfo(2, "c:1"),
    }
    assert ShardMap(1, shards, tuple(before)).weights() == {0: 1, 1: 0, 2: 1}


def test_balancing_refuses_impossible_weights() -> None:
    with pytest.raises(ValueError, match="weight above 0"):
        balance_slots(None, {0: 0})
    with pytest.raises(ValueError, match=">= 0"):
        balance_slots(None, {0: 1, 1: -1})
    with pytest.raises(ValueError, match="slots"):
        balance_slots([0] * 10, {0: 1})


@given(tenant_ids)
@FULL_TABLES
def test_a_move_overrides_a_pin_which_overrides_the_slot(tenant: str) -> None:
    table = balance_slots(None, {0: 1, 1: 1, 2: 1})
    plain = make_map(table)
    assert plain.shard_for(tenant) == table[slot_of(tenant)]
    assert plain.shards_for(tenant) == (table[slot_of(tenant)],)

    pin_to = (table[slot_of(tenant)] + 1) % 3
    pinned = make_map(table, pins={tenant: pin_to})
    assert pinned.shard_for(tenant) == pin_to

    move_to = (pin_to + 1) % 3
    move = TenantMove(tenant, from_shard_id=pin_to, to_shard_id=move_to, started_at_ms=1)
    moving = make_map(table, pins={tenant: pin_to}, moves={tenant: move})
    assert moving.shard_for(tenant) == move_to
    assert moving.shards_for(tenant) == (move_to, pin_to)
    assert moving.tenants_moving_from(pin_to) == [move]
    assert moving.tenants_moving_to(move_to) == [move]
    # Nobody else is affected.
    other = tenant + "x"
    assert moving.shard_for(other) == table[slot_of(other)]


def test_slot_ranges_cover_every_slot_once() -> None:
    before = balance_slots(None, {0: 1, 1: 1, 2: 1})
    table = make_map(balance_slots(before, {0: 1, 1: 1, 2: 1, 3: 1}))
    ranges = table.slot_ranges()
    assert ranges[0][0] == 0
    assert ranges[-1][1] == SLOT_COUNT - 1
    for (_, end, _), (start, _, _) in itertools.pairwise(ranges):
        assert start == end + 1
    assert sum(end - start + 1 for start, end, _ in ranges) == SLOT_COUNT
    assert table.slot_counts() == {0: 4096, 1: 4096, 2: 4096, 3: 4096}


def test_a_map_needs_every_slot_and_cannot_be_changed_by_a_holder() -> None:
    with pytest.raises(ValueError, match="16384 slots"):
        ShardMap(1, {0: ShardInfo(0, "a:1")}, (0,))
    shard_map = make_map([0] * SLOT_COUNT, pins={"t": 0})
    with pytest.raises(TypeError):
        shard_map.pins["u"] = 0  # type: ignore[index]
