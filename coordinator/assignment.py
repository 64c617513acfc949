"""Which worker serves which shards: every shard gets a worker, every worker gets shards.

Workers are sorted by ID so every coordinator replica computes the same answer from the same
live set. With more workers than shards, several workers share a shard (claims are atomic,
so sharing is safe); with fewer, shards are dealt round-robin.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def assign(shard_ids: Iterable[int], worker_ids: Iterable[str]) -> dict[str, list[int]]:
    shards: Sequence[int] = sorted(shard_ids)
    workers: Sequence[str] = sorted(set(worker_ids))
    out: dict[str, list[int]] = {w: [] for w in workers}
    if not shards or not workers:
        return out
    if len(workers) >= len(shards):
        for i, w in enumerate(workers):
            out[w].append(shards[i % len(shards)])
    else:
        for i, s in enumerate(shards):
            out[workers[i % len(workers)]].append(s)
    return out
