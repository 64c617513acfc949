"""How the API commands show jobs: a table of a page, one job's fields, JSON documents with
payloads and results as the JSON they hold."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from shardq.coordinator.cli.terminal import print_table, when
from shardq.v1 import common_pb2


def state_name(state: int) -> str:
    return common_pb2.JobState.Name(state).removeprefix("JOB_STATE_").lower()  # type: ignore[arg-type]


def json_value(raw: bytes) -> Any:
    """A payload or result as the JSON it holds (its text when it is not JSON)."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def message_dict(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        msg, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )


def job_dict(job: common_pb2.Job) -> dict[str, Any]:
    out = message_dict(job)
    out["state"] = state_name(job.state)
    out["payload"] = json_value(job.payload)
    out["result"] = json_value(job.result)
    return out


def print_job(job: common_pb2.Job) -> None:
    rows: list[tuple[str, object]] = [
        ("job_id", job.job_id),
        ("tenant", job.tenant_id),
        ("state", state_name(job.state) + (" (cancel requested)" if job.cancel_requested else "")),
        ("handler", job.handler),
        ("queue", job.queue or "default"),
        ("priority", job.priority),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("run_at", when(job.run_at_unix_ms)),
        ("created_at", when(job.created_at_unix_ms)),
        ("started_at", when(job.started_at_unix_ms)),
        ("finished_at", when(job.finished_at_unix_ms)),
        ("worker", job.worker_id or "-"),
        ("request_id", job.request_id),
        ("shard", job.shard_id),
        ("payload", job.payload.decode("utf-8", "replace")),
    ]
    if job.last_error:
        rows.append(("last_error", job.last_error))
    if job.result:
        rows.append(("result", job.result.decode("utf-8", "replace")))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")


def print_jobs(jobs: Sequence[common_pb2.Job], next_page_token: str, dead: bool = False) -> None:
    headers = ["JOB_ID", "STATE", "HANDLER", "QUEUE", "PRIO", "ATTEMPTS", "RUN_AT", "CREATED"]
    rows: list[list[object]] = [
        [
            j.job_id,
            state_name(j.state),
            j.handler,
            j.queue or "default",
            j.priority,
            f"{j.attempts}/{j.max_attempts}",
            when(j.run_at_unix_ms),
            when(j.created_at_unix_ms),
        ]
        for j in jobs
    ]
    if dead:
        headers.append("LAST_ERROR")
        for row, j in zip(rows, jobs, strict=True):
            row.append(" ".join(j.last_error.split())[:60])
    print_table(headers, rows)
    if next_page_token:
        print(f"\nmore: --page-token {next_page_token}")
