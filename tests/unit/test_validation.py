"""Input checks: a table of good and bad values per validator; a bad one names its field."""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import Any

import pytest
from redis.asyncio import Redis

from shardq.common import validation
from shardq.common.errors import InvalidArgument
from shardq.shard.client import ShardClient
from shardq.shard.models import NewJob

# Characters that would change a Redis key's meaning (separator, cluster hash tag, glob) or
# that no ID needs (space, control characters).
KEY_BREAKERS = [":", "{", "}", "*", "?", "[", " ", "\0", "\n", "\t", "é"]

Validator = Callable[[Any], Any]

TABLE: list[tuple[str, Validator, list[Any], list[Any]]] = [
    (
        "tenant_id",
        validation.tenant_id,
        ["a", "acme", "ACME-01", "a.b_c-d", "x" * 64],
        ["", "x" * 65, None, 7, b"acme", *(f"ac{c}me" for c in KEY_BREAKERS)],
    ),
    (
        "request_id",
        validation.request_id,
        ["r", "order:42", "a@b/c+d=e-f_g.h", "x" * 128],
        ["", "x" * 129, None, "a b", "a{b}", "a*b", "a\0b", "é"],
    ),
    (
        "handler",
        validation.handler,
        ["h", "email.send", "billing:invoice-v2", "x" * 128],
        ["", "x" * 129, None, "a b", "a/b", "a{b}", "a\0b"],
    ),
    (
        "schedule_id",
        validation.schedule_id,
        ["s", "nightly-report_1.v2", "x" * 64],
        ["", "x" * 65, None, "a/b", *(f"s{c}" for c in KEY_BREAKERS)],
    ),
    (
        "job_id",
        validation.job_id,
        ["J1", "01HZX3Y7Q8W9E0R1T2Y3U4I5O6", "x" * 64],
        ["", "x" * 65, None, "J-1", "J_1", "J.1", *(f"J{c}" for c in KEY_BREAKERS)],
    ),
    (
        "worker_id",
        validation.worker_id,
        ["w", "host-1:4242@pool.a", "x" * 128],
        ["", "x" * 129, None, "a b", "a{b", "a*b", "a\0b"],
    ),
    (
        "priority",
        validation.priority,
        [0, 1, 5, 9],
        [-1, 10, 100, True, False, 1.0, "5", None],
    ),
]

CASES = [
    pytest.param(field, check, value, good, id=f"{field}-{'good' if good else 'bad'}-{value!r:.20}")
    for field, check, goods, bads in TABLE
    for good, values in ((True, goods), (False, bads))
    for value in values
]


@pytest.mark.parametrize(("field", "check", "value", "good"), CASES)
def test_each_validator_accepts_good_values_and_names_its_field_for_bad_ones(
    field: str, check: Validator, value: Any, good: bool
) -> None:
    if good:
        assert check(value) == value
        return
    with pytest.raises(InvalidArgument) as err:
        check(value)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


def test_a_validator_can_report_another_field_name() -> None:
    with pytest.raises(InvalidArgument) as err:
        validation.tenant_id("a:b", field="tenant")
    assert err.value.field == "tenant"


@pytest.mark.parametrize(
    ("value", "ok"),
    [(0, True), (5, True), (10, True), (-1, False), (11, False), (True, False),
     (5.0, False), ("5", False), (None, False), (2**64, False)],
)  # fmt: skip
def test_int_in_range_takes_only_true_integers_within_both_bounds(value: Any, ok: bool) -> None:
    if ok:
        assert validation.int_in_range(value, 0, 10, "n") == value
        return
    with pytest.raises(InvalidArgument) as err:
        validation.int_in_range(value, 0, 10, "n")
    assert err.value.field == "n"


@pytest.mark.parametrize(
    ("value", "ok"),
    [(b"", True), (b"{}", True), (b"x" * 16, True), (bytearray(b"{}"), True),
     (b"x" * 17, False), ("{}", False), (None, False), (memoryview(b"{}"), False)],
)  # fmt: skip
def test_a_payload_is_bytes_up_to_the_limit(value: Any, ok: bool) -> None:
    if ok:
        got = validation.payload(value, 16)
        assert type(got) is bytes
        assert got == bytes(value)
        return
    with pytest.raises(InvalidArgument) as err:
        validation.payload(value, 16)
    assert err.value.field == "payload"


NAME_VALUES = {
    field: [*good[:2], *bad[:4]]
    for field, _check, good, bad in TABLE
    if field in ("tenant_id", "handler", "request_id")
}


@pytest.mark.parametrize("tenant", NAME_VALUES["tenant_id"])
@pytest.mark.parametrize("handler", NAME_VALUES["handler"])
@pytest.mark.parametrize("request_id", NAME_VALUES["request_id"])
def test_names_checks_a_jobs_three_names_as_the_three_checks_do_in_turn(
    tenant: Any, handler: Any, request_id: Any
) -> None:
    def one_by_one() -> None:
        validation.tenant_id(tenant)
        validation.handler(handler)
        validation.request_id(request_id)

    try:
        one_by_one()
    except InvalidArgument as expected:
        with pytest.raises(InvalidArgument) as err:
            validation.names(tenant, handler, request_id)
        assert (err.value.field, err.value.message) == (expected.field, expected.message)
    else:
        validation.names(tenant, handler, request_id)


def test_the_shard_api_takes_a_subtype_where_its_checks_do() -> None:
    # ShardClient.prepare tests the usual types inline, and hands any other to the checks.
    class Level(IntEnum):
        HIGH = 7

    client = ShardClient(Redis())  # prepare needs no server: it never connects
    job = NewJob(
        tenant="acme",
        handler="h",
        payload=bytearray(b"{}"),
        request_id="r1",
        priority=Level.HIGH,
        max_attempts=Level.HIGH,
        timeout_ms=Level.HIGH,
        queue="q1",
    )
    prepared = client.prepare(job, 1_700_000_000_000)
    assert (prepared.payload, type(prepared.payload)) == (b"{}", bytes)
    assert (prepared.priority, prepared.max_attempts, prepared.timeout_ms) == (7, 7, 7)
    assert prepared.queue == "q1"
    with pytest.raises(InvalidArgument) as err:
        client.prepare(job._replace(queue="q:1"), 1_700_000_000_000)
    assert err.value.field == "queue"
