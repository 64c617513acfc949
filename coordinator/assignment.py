"""Which worker claims which queues on which shards.

Shards are dealt per queue, over the live workers that serve that queue: for every queue that
any live worker serves, every shard gets at least one of them, and a worker gets only shards
where it claims at least one of its own queues (a worker is never sent to a shard for someone
else's queue, where it would only find jobs it has no handler for).

Workers of one queue that report different handler sets (two groups allowed to share a queue,
or a rolling deploy that adds a handler) are dealt the shards separately, set by set, so every
shard also has a worker of each set: a job handed back by a worker without its handler finds
one with it on the same shard. Workers with the same handlers, the usual case, are one deal.

Each deal is the same rule over a sorted list, so every coordinator replica computes the same
answer from the same live set: with more workers than shards, several workers share a shard
(claims are atomic, so sharing is safe); with fewer, shards are dealt round-robin. Workers
that serve the same queues get the same deal for each of them, so a worker of several queues
claims them all on the same few shards rather than connecting to more shards per queue.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

#: worker_id -> {shard_id: the queues it claims on that shard}, shards and queues sorted.
Assignment = dict[str, dict[int, tuple[str, ...]]]


class Serves(Protocol):
    """What assignment needs to know of a worker (``registry.WorkerInfo`` is one)."""

    @property
    def queues(self) -> Collection[str]: ...

    @property
    def handlers(self) -> Collection[str]: ...


class Serving(NamedTuple):
    """A worker's queues and handler names, for callers without a ``WorkerInfo``."""

    queues: Collection[str]
    handlers: Collection[str] = frozenset()


def deal(shard_ids: Iterable[int], worker_ids: Iterable[str]) -> dict[str, list[int]]:
    """Every shard to some worker and some shard to every worker (when there are shards)."""
    shards: Sequence[int] = sorted(set(shard_ids))
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


def assign(shard_ids: Iterable[int], workers: Mapping[str, Serves]) -> Assignment:
    """Deal ``shard_ids`` per queue (and per handler set within a queue) over ``workers``."""
    shards = sorted(set(shard_ids))
    serving: dict[tuple[str, frozenset[str]], list[str]] = defaultdict(list)
    for worker in sorted(workers):
        info = workers[worker]
        handlers = frozenset(info.handlers)
        for queue in set(info.queues):
            serving[(queue, handlers)].append(worker)
    claims: dict[str, dict[int, set[str]]] = {w: defaultdict(set) for w in workers}
    for (queue, _), members in serving.items():
        for worker, dealt in deal(shards, members).items():
            for shard in dealt:
                claims[worker][shard].add(queue)
    return {
        w: {s: tuple(sorted(qs)) for s, qs in sorted(by_shard.items())}
        for w, by_shard in sorted(claims.items())
    }
