"""The gate's bookkeeping (coordinator/gate.py) on a clock the test moves: the buckets of
failed authentications per peer and per process, and the caps on calls in flight. The
process-level behaviour (nothing read before the checks, lookups counted by the real token
store) is tests/integration/test_gate.py."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest

from shardq.common.errors import ResourceExhausted, Unauthenticated, Unavailable
from shardq.coordinator.gate import Bucket, Gate, GateSettings, peer_host
from shardq.coordinator.tokens import Principal, well_formed

VALID = "sq_0123456789ab_" + "A" * 43
ACME = Principal(role="tenant", tenant_id="acme", token_id="0123456789ab")
ADMIN = Principal(role="admin", tenant_id=None, token_id="ffffffffffff")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Context:
    """What the gate reads of a call: its metadata and its peer."""

    def __init__(self, token: str | None, peer: str = "ipv4:10.0.0.1:5000") -> None:
        self.token, self._peer = token, peer

    def invocation_metadata(self) -> Any:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def peer(self) -> str:
        return self._peer


class Store:
    """A token store that knows one token and counts its lookups."""

    def __init__(self) -> None:
        self.lookups = 0
        self.seen: set[str] = set()
        self.down = False

    async def check(self, token: str | None) -> Principal:
        if not token:
            raise Unauthenticated("missing")
        if well_formed(token) and token not in self.seen:  # as TokenStore.authenticate
            self.lookups += 1
            if self.down:
                raise Unavailable("the database cannot be reached")
        if token == VALID:
            self.seen.add(token)
            return ACME
        raise Unauthenticated("the token is not valid")

    def known(self, token: str) -> bool:
        return token in self.seen


def forged() -> str:
    return f"sq_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"


def gate(**settings: Any) -> tuple[Gate, Store, Clock]:
    store, clock = Store(), Clock()
    return Gate(store.check, store.known, GateSettings(**settings), clock=clock), store, clock


async def admit(g: Gate, token: str | None, peer: str = "ipv4:10.0.0.1:5000") -> Any:
    try:
        return await g.admit(Context(token, peer))  # type: ignore[arg-type]
    except (Unauthenticated, ResourceExhausted, Unavailable) as exc:
        return type(exc)


def test_peer_host_drops_the_port_and_the_brackets() -> None:
    assert peer_host("ipv4:10.0.0.7:5123") == "10.0.0.7"
    assert peer_host("ipv6:[::1]:5123") == "::1"
    assert peer_host("unix:/tmp/sock") == "unix"


def test_a_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    b = Bucket(2, 0.5, now=0.0)
    b.take(0.0)
    b.take(0.0)
    assert b.wait_s(0.0) == pytest.approx(2.0)
    assert b.wait_s(1.0) == pytest.approx(1.0)
    assert b.wait_s(2.0) == 0
    b.give()
    b.give()
    assert b.level == 2  # never past the burst


async def test_one_peer_gets_its_burst_of_guesses_then_waits_for_the_refill() -> None:
    g, store, clock = gate(auth_failures_burst=3, auth_failures_per_s=1.0)
    assert [await admit(g, forged()) for _ in range(3)] == [Unauthenticated] * 3
    assert await admit(g, forged()) is ResourceExhausted
    assert store.lookups == 3
    # Free refusals are not throttled, and cost nothing: no token, garbage.
    assert await admit(g, None) is Unauthenticated
    assert await admit(g, "not-a-token") is Unauthenticated
    # Another address has its own bucket.
    assert await admit(g, forged(), "ipv4:10.0.0.2:1") is Unauthenticated
    clock.now += 1.0
    assert await admit(g, forged()) is Unauthenticated
    assert await admit(g, forged()) is ResourceExhausted
    assert store.lookups == 5
    assert g.refused["auth_throttled"] == 2


async def test_a_known_token_is_served_from_a_throttled_address() -> None:
    g, _, _ = gate(auth_failures_burst=1)
    assert await admit(g, VALID) == ACME  # read once: now known
    assert await admit(g, forged()) is Unauthenticated
    assert await admit(g, forged()) is ResourceExhausted
    assert await admit(g, VALID) == ACME


async def test_a_valid_token_does_not_use_up_the_buckets() -> None:
    g, store, _ = gate(auth_failures_burst=1, unknown_tokens_burst=1)
    for _ in range(5):
        store.seen.clear()  # forgotten: a lookup each time
        assert await admit(g, VALID) == ACME
    assert await admit(g, forged()) is Unauthenticated  # the one failure allowed
    assert store.lookups == 6


async def test_a_database_outage_is_not_charged_to_the_caller() -> None:
    g, store, _ = gate(auth_failures_burst=1)
    store.down = True
    assert [await admit(g, VALID) for _ in range(3)] == [Unavailable] * 3
    store.down = False
    assert await admit(g, VALID) == ACME


async def test_guesses_from_many_addresses_meet_the_process_bucket() -> None:
    g, store, clock = gate(auth_failures_burst=5, unknown_tokens_burst=10, unknown_tokens_per_s=2)
    answers = [await admit(g, forged(), f"ipv4:10.0.{i}.1:1") for i in range(40)]
    assert answers.count(Unauthenticated) == 10
    assert answers.count(Unavailable) == 30  # retried by clients; no lookup
    assert store.lookups == 10
    clock.now += 1.0
    answers = [await admit(g, forged(), f"ipv4:10.1.{i}.1:1") for i in range(5)]
    assert answers.count(Unauthenticated) == 2


async def test_concurrent_lookups_are_charged_before_they_answer() -> None:
    g, store, _ = gate(auth_failures_burst=5)
    answers = await asyncio.gather(*(admit(g, forged()) for _ in range(50)))
    assert answers.count(Unauthenticated) == 5
    assert store.lookups == 5


def test_calls_in_flight_are_capped_per_tenant_and_batches_per_process() -> None:
    g, _, _ = gate(max_calls_per_tenant=2, max_batch_calls=1)
    first = g._enter_call(ACME, batch=False)
    second = g._enter_call(ACME, batch=True)
    with pytest.raises(ResourceExhausted, match="2 calls in flight"):
        g._enter_call(ACME, batch=False)
    with pytest.raises(ResourceExhausted, match="SubmitJobs"):
        g._enter_call(ADMIN, batch=True)  # the admin meets the process-wide cap
    admin_calls = [g._enter_call(ADMIN, batch=False) for _ in range(10)]  # no tenant cap
    first()
    third = g._enter_call(ACME, batch=False)
    second()
    fourth = g._enter_call(ADMIN, batch=True)
    for release in (third, fourth, *admin_calls):
        release()
    assert (g._calls, g.batch_calls) == ({}, 0)


async def test_streams_are_capped_per_tenant_and_per_process() -> None:
    g, _, _ = gate(max_streams_per_tenant=1, max_streams=2)
    acme = await g._enter_stream(ACME)
    with pytest.raises(ResourceExhausted, match="1 streams open"):
        await g._enter_stream(ACME)
    admin = await g._enter_stream(ADMIN)
    with pytest.raises(ResourceExhausted, match="2 streams are open"):
        await g._enter_stream(ADMIN)
    acme()
    admin()
    assert (g._streams, g.streams) == ({}, 0)
