"""What the client puts in a JobSpec by itself (the payload's JSON, a request_id) and how it
reads a state back."""

from __future__ import annotations

import json
import re
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardq.client import JobState, job_spec
from shardq.client.model import ItemError, SubmitItem
from shardq.client.requests import encode_payload, new_request_id
from shardq.common import validation
from shardq.v1 import jobs_pb2

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(JSON_VALUES)
def test_a_payload_is_compact_json(value: Any) -> None:
    assert encode_payload(value) == json.dumps(value, separators=(",", ":")).encode()
    assert json.loads(encode_payload(value)) == value


def test_bytes_pass_through_and_what_json_cannot_encode_is_refused() -> None:
    assert encode_payload(b'{"a": 1}') == b'{"a": 1}'
    assert encode_payload(bytearray(b"[]")) == b"[]"
    with pytest.raises(TypeError):
        encode_payload({1, 2})


def test_a_request_id_the_client_makes_is_32_hex_digits_and_new_each_time() -> None:
    made = {new_request_id() for _ in range(1_000)}
    assert len(made) == 1_000
    for rid in made:
        assert re.fullmatch(r"[0-9a-f]{32}", rid)
        assert validation.request_id(rid) == rid


def test_a_job_spec_without_a_request_id_gets_one_and_keeps_one_given() -> None:
    assert re.fullmatch(r"[0-9a-f]{32}", job_spec("h", 1).request_id)
    assert job_spec("h", 1, request_id="order-7").request_id == "order-7"


@pytest.mark.parametrize("state", list(JobState))
def test_every_state_reads_from_its_number(state: JobState) -> None:
    assert JobState.from_proto(int(state)) is state


@pytest.mark.parametrize("number", [7, 99, -1])
def test_a_state_newer_than_the_client_reads_as_unspecified(number: int) -> None:
    assert JobState.from_proto(number) is JobState.UNSPECIFIED


def test_a_batch_answers_items_read_each_field_and_an_unknown_state() -> None:
    ok = jobs_pb2.SubmitJobsItem(
        index=3, job_id="J", request_id="r3", deduplicated=True, state=JobState.READY.value
    )
    assert SubmitItem.from_proto(ok) == SubmitItem(3, "J", "r3", True, JobState.READY, None)
    newer = jobs_pb2.SubmitJobsItem(index=0, job_id="J", request_id="r0", state=99)
    assert SubmitItem.from_proto(newer).state is JobState.UNSPECIFIED
    refused = jobs_pb2.SubmitJobsItem(index=1, request_id="r1")
    refused.error.code, refused.error.field = 3, "priority"
    item = SubmitItem.from_proto(refused)
    assert item.job_id is None and not item.ok
    assert item.error == ItemError(grpc.StatusCode.INVALID_ARGUMENT, "", "priority")
