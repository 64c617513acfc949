"""The shardq.v1 contract: generated code in sync with the .proto files, and their house style."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from shardq.v1 import (
    admin_pb2_grpc,
    common_pb2,
    jobs_pb2_grpc,
    schedules_pb2_grpc,
    tenants_pb2_grpc,
    workers_pb2_grpc,
)

PROTO_ROOT = Path(__file__).resolve().parents[2] / "proto"
API_DIR = PROTO_ROOT / "shardq" / "v1"

# The API surface DESIGN.md asks for: service -> its methods.
EXPECTED_SERVICES = {
    "JobService": {
        "SubmitJob",
        "SubmitJobs",
        "GetJob",
        "CancelJob",
        "ListJobs",
        "WatchJob",
        "ListDeadJobs",
        "RequeueDeadJobs",
    },
    "ScheduleService": {"CreateSchedule", "ListSchedules", "DeleteSchedule"},
    "TenantService": {"GetTenantStats"},
    "AdminService": {
        "GetShardMap",
        "ListTenantStats",
        "SetTenantLimits",
        "GetTenantLimits",
        "Pause",
        "Resume",
        "ListShardStatus",
    },
    "WorkerService": {"WatchAssignment"},
}

# Declarations that must carry a leading `//` comment on the line right above them.
_DECLARATION = re.compile(
    r"""^\s*(
        (message|enum|service|oneof)\s+\w+\s*\{     # message / enum / service / oneof
      | rpc\s+\w+\s*\(                              # rpc
      | ((optional|repeated)\s+)?[\w.]+\s+\w+\s*=\s*\d+\s*;   # field
      | [A-Z][A-Z0-9_]*\s*=\s*\d+\s*;               # enum value
    )""",
    re.VERBOSE,
)
_MESSAGE = re.compile(r"^\s*message\s+(\w+)\s*\{")
_NEXT_ID = re.compile(r"^\s*//\s*Next ID:\s*(\d+)\s*$")


def _load_generator() -> ModuleType:
    path = PROTO_ROOT / "generate.py"
    spec = importlib.util.spec_from_file_location("shardq_proto_generate", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _proto_sources() -> list[Path]:
    sources = sorted(API_DIR.glob("*.proto"))
    assert sources, f"no .proto files under {API_DIR}"
    return sources


def _leading_comment(lines: list[str], index: int) -> list[str]:
    """The run of `//` lines directly above lines[index]."""
    comment: list[str] = []
    i = index - 1
    while i >= 0 and lines[i].lstrip().startswith("//"):
        comment.insert(0, lines[i])
        i -= 1
    return comment


def _message_descriptors() -> list[Descriptor]:
    pool = descriptor_pool.Default()
    messages: list[Descriptor] = []
    for source in _proto_sources():
        file = pool.FindFileByName(f"shardq/v1/{source.name}")
        messages.extend(file.message_types_by_name.values())
    return messages


def test_committed_generated_code_matches_the_proto_files() -> None:
    stale = _load_generator().check()
    assert stale == [], (
        "generated code is stale; run `python proto/generate.py` and commit: " + ", ".join(stale)
    )


def test_every_service_and_method_of_the_design_is_in_the_descriptor_pool() -> None:
    # Importing the *_pb2_grpc modules registers their files in the default pool.
    assert all(
        m is not None
        for m in (
            jobs_pb2_grpc,
            schedules_pb2_grpc,
            tenants_pb2_grpc,
            admin_pb2_grpc,
            workers_pb2_grpc,
        )
    )
    pool = descriptor_pool.Default()
    for service_name, methods in EXPECTED_SERVICES.items():
        service = pool.FindServiceByName(f"shardq.v1.{service_name}")
        assert set(service.methods_by_name) == methods, service_name


def test_watch_calls_are_server_streaming() -> None:
    pool = descriptor_pool.Default()
    for full_name in ("shardq.v1.JobService.WatchJob", "shardq.v1.WorkerService.WatchAssignment"):
        method = pool.FindMethodByName(full_name)
        assert method.server_streaming, full_name
        assert not method.client_streaming, full_name


@pytest.mark.parametrize("source", _proto_sources(), ids=lambda p: p.name)
def test_every_declaration_has_a_leading_comment(source: Path) -> None:
    lines = source.read_text(encoding="utf-8").splitlines()
    uncommented = [
        f"{source.name}:{i + 1}: {line.strip()}"
        for i, line in enumerate(lines)
        if _DECLARATION.match(line) and not _leading_comment(lines, i)
    ]
    assert uncommented == []


def test_every_message_states_its_next_field_id_correctly() -> None:
    declared: dict[str, int] = {}
    for source in _proto_sources():
        lines = source.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if match := _MESSAGE.match(line):
                ids = [m for c in _leading_comment(lines, i) if (m := _NEXT_ID.match(c))]
                assert len(ids) == 1, f"{source.name}:{i + 1}: one `// Next ID: N` line expected"
                declared[match.group(1)] = int(ids[0].group(1))
    messages = _message_descriptors()
    assert {m.name for m in messages} == set(declared)
    for message in messages:
        next_id = max((f.number for f in message.fields), default=0) + 1
        assert declared[message.name] == next_id, message.name


def test_int64_fields_carry_a_unit_in_their_name() -> None:
    for message in _message_descriptors():
        for field in message.fields:
            if field.type == FieldDescriptor.TYPE_INT64:
                assert field.name.endswith("_ms"), f"{message.name}.{field.name}"


def test_job_states_are_the_designed_lifecycle() -> None:
    assert [(v.name, v.number) for v in common_pb2.JobState.DESCRIPTOR.values] == [
        ("JOB_STATE_UNSPECIFIED", 0),
        ("JOB_STATE_SCHEDULED", 1),
        ("JOB_STATE_READY", 2),
        ("JOB_STATE_ACTIVE", 3),
        ("JOB_STATE_SUCCEEDED", 4),
        ("JOB_STATE_DEAD", 5),
        ("JOB_STATE_CANCELLED", 6),
    ]
