"""The count fields a client sends are int32, so a caller's -1 is -1 (docs/clients.md).

int32 and uint32 share the varint wire type and encode every value >= 0 the same bytes, so
the change from uint32 broke no client; a negative int32 is sent as a 10-byte varint, and
the 5-byte form a client generated from the old uint32 field sends decodes to -1 as well.
The fields left unsigned say in their range errors what a huge value likely meant.
"""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from shardq.common import validation
from shardq.common.errors import InvalidArgument
from shardq.v1 import common_pb2, jobs_pb2, schedules_pb2

SIGNED: list[tuple[type[Message], str]] = [
    (common_pb2.JobSpec, "priority"),
    (common_pb2.JobSpec, "max_attempts"),
    (common_pb2.JobSpec, "timeout_ms"),
    (common_pb2.TenantLimits, "weight"),
    (jobs_pb2.ListJobsRequest, "page_size"),
    (jobs_pb2.ListDeadJobsRequest, "page_size"),
    (schedules_pb2.ListSchedulesRequest, "page_size"),
]
IDS = [f"{m.DESCRIPTOR.name}.{f}" for m, f in SIGNED]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _tag(message: type[Message], name: str) -> bytes:
    number = message.DESCRIPTOR.fields_by_name[name].number
    return _varint(number << 3)  # wire type 0: varint


@pytest.mark.parametrize(("message", "name"), SIGNED, ids=IDS)
def test_the_field_is_int32(message: type[Message], name: str) -> None:
    field = message.DESCRIPTOR.fields_by_name[name]
    assert field.type == FieldDescriptor.TYPE_INT32
    assert field.type != descriptor_pb2.FieldDescriptorProto.TYPE_UINT32


@pytest.mark.parametrize(("message", "name"), SIGNED, ids=IDS)
def test_minus_one_arrives_as_minus_one_in_either_encoding(
    message: type[Message], name: str
) -> None:
    as_int32 = _tag(message, name) + _varint((1 << 64) - 1)  # 10 bytes: the int32 encoding
    as_uint32 = _tag(message, name) + _varint((1 << 32) - 1)  # 5 bytes: an old uint32 client
    assert len(as_int32) - len(as_uint32) == 5
    assert getattr(message.FromString(as_int32), name) == -1
    assert getattr(message.FromString(as_uint32), name) == -1
    assert message(**{name: -1}).SerializeToString() == as_int32


@pytest.mark.parametrize("value", [1, 9, 127, 128, 1000, 86_400_000, 2**31 - 1])
@pytest.mark.parametrize(("message", "name"), SIGNED, ids=IDS)
def test_values_at_or_above_zero_have_the_bytes_uint32_gave_them(
    message: type[Message], name: str, value: int
) -> None:
    encoded = _tag(message, name) + _varint(value)
    assert message(**{name: value}).SerializeToString() == encoded
    assert getattr(message.FromString(encoded), name) == value


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        (2**32 - 1, " (-1 as a 32-bit unsigned value?)"),
        (2**32 - 7, " (-7 as a 32-bit unsigned value?)"),
        (2**64 - 1, " (-1 as a 64-bit unsigned value?)"),
        (2**31 - 1, ""),  # a plain value too big: no guess
        (2**40, ""),
        (-1, ""),  # already what the caller meant
    ],
)
def test_an_out_of_range_value_of_an_unsigned_field_says_what_it_likely_meant(
    value: int, hint: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        validation.int_in_range(value, 0, 1000, "max_pending")
    assert info.value.message == f"{value} is outside [0, 1000]{hint}"
