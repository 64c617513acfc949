"""Job IDs: 26 Crockford base32 characters, sortable by creation time, unique; and the clients'
request IDs, 32 hex digits."""

from __future__ import annotations

import collections
import json
import os
import re
import time
from collections.abc import Callable

import pytest

from shardq.client.requests import new_request_id
from shardq.common import ids, validation
from shardq.common.ids import new_job_id

CROCKFORD_RE = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
#: Crockford base32 to the digits ``int(..., 32)`` reads.
_DECODE = str.maketrans("0123456789ABCDEFGHJKMNPQRSTVWXYZ", "0123456789abcdefghijklmnopqrstuv")


def test_a_job_id_is_26_crockford_base32_characters_and_a_valid_job_id() -> None:
    jid = new_job_id()
    assert CROCKFORD_RE.fullmatch(jid)
    assert validation.job_id(jid) == jid


@pytest.mark.parametrize("now_ms", [0, 1, 1_700_000_000_000, 2**48 - 1])
def test_the_first_ten_characters_encode_the_timestamp(now_ms: int) -> None:
    jid = new_job_id(now_ms)
    assert len(jid) == 26
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    value = 0
    for ch in jid:
        value = value * 32 + alphabet.index(ch)
    assert value >> 80 == now_ms


@pytest.mark.parametrize("random", [bytes(10), b"\xff" * 10, bytes(range(1, 11))])
def test_the_last_sixteen_characters_encode_the_random_bits(
    random: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shardq.common.ids.os.urandom", lambda n: random * (n // 10))
    monkeypatch.setattr(ids, "_randoms", collections.deque())
    jid = new_job_id(1_700_000_000_000)
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    value = 0
    for ch in jid:
        value = value * 32 + alphabet.index(ch)
    assert value & (2**80 - 1) == int.from_bytes(random, "big")
    assert value >> 80 == 1_700_000_000_000


def test_ids_sort_by_creation_time() -> None:
    times = [0, 1, 999, 1_000, 1_700_000_000_000, 1_700_000_000_001, 2**47, 2**48 - 1]
    ids = [new_job_id(t) for t in times]
    assert sorted(ids) == ids


def test_ids_made_later_sort_after_ids_made_earlier_whatever_their_random_part() -> None:
    earlier = [new_job_id(1_700_000_000_000) for _ in range(1_000)]
    later = [new_job_id(1_700_000_000_001) for _ in range(1_000)]
    assert max(earlier) < min(later)


def test_100k_ids_made_in_the_same_millisecond_are_unique() -> None:
    ids = {new_job_id(1_700_000_000_000) for _ in range(100_000)}
    assert len(ids) == 100_000


def test_without_a_time_the_wall_clock_is_used() -> None:
    before = time.time_ns() // 1_000_000
    jid = new_job_id()
    after = time.time_ns() // 1_000_000
    assert new_job_id(before)[:10] <= jid[:10] <= new_job_id(after)[:10]


def test_each_id_carries_its_own_millisecond_when_calls_alternate_between_two() -> None:
    # The timestamp's digits are kept for the last ms: a stale copy would show here.
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    for t in [5, 5, 6, 5, 6, 6, 2**48 - 1, 5]:
        value = 0
        for ch in new_job_id(t):
            value = value * 32 + alphabet.index(ch)
        assert value >> 80 == t


def test_the_random_source_is_read_once_per_64_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``getrandom`` system call per ID was a tenth of a coordinator's CPU: the random bits
    of 64 IDs come from one read, and no value is used twice."""
    reads: list[int] = []

    def urandom(n: int) -> bytes:
        reads.append(n)  # each 10 bytes a value of its own
        return b"".join((len(reads) * 1_000 + k).to_bytes(10, "big") for k in range(n // 10))

    monkeypatch.setattr("shardq.common.ids.os.urandom", urandom)
    monkeypatch.setattr(ids, "_randoms", collections.deque())
    made = [new_job_id(1_700_000_000_000) for _ in range(640)]
    assert reads == [640] * 10
    assert len(set(made)) == 640


def _job_id_random_part() -> int:
    return int(new_job_id()[10:].translate(_DECODE), 32)


@pytest.mark.parametrize(
    ("make", "made_ahead"),
    [(_job_id_random_part, "_randoms"), (new_request_id, "_hex_randoms")],
    ids=["job IDs", "request IDs"],
)
def test_a_forked_child_does_not_make_its_parents_ids(
    make: Callable[[], object], made_ahead: str
) -> None:
    """The values made ahead are dropped in a forked child: parent and child would otherwise
    both take the same next ones."""
    # Emptied first, so make() reads a fresh 64 and leaves 63 ahead: had earlier tests left one
    # value, make() would take it and leave none to compare (1 run in 64 failed so).
    getattr(ids, made_ahead).clear()
    make()  # values made ahead, in this process
    parent_next = list(getattr(ids, made_ahead))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next IDs' random parts, to the parent
        os.close(read)
        os.write(write, json.dumps([make() for _ in range(8)]).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = json.loads(f.read())
    os.waitpid(pid, 0)
    assert parent_next and not set(child) & set(parent_next)


def test_request_ids_read_the_random_source_once_per_64(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client's request IDs (``secrets.token_hex`` was a system call each: 12% of a client
    sending batches) come 64 from one read, each 16 bytes of it as 32 hex digits, none twice."""
    reads: list[int] = []

    def urandom(n: int) -> bytes:
        reads.append(n)
        return b"".join((len(reads) * 1_000 + k).to_bytes(16, "big") for k in range(n // 16))

    monkeypatch.setattr("shardq.common.ids.os.urandom", urandom)
    monkeypatch.setattr(ids, "_hex_randoms", collections.deque())
    made = [new_request_id() for _ in range(128)]
    assert reads == [1_024, 1_024]
    assert (
        made[0] == (1_000).to_bytes(16, "big").hex()
        and made[-1] == (2_063).to_bytes(16, "big").hex()
    )
    assert len(set(made)) == 128
