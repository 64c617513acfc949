"""How the API commands show jobs: a table of a page, one job's fields, JSON documents with
payloads and results as the JSON they hold."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from shardq.client import Job, JobState
from shardq.coordinator.cli.terminal import print_table, when


def state_name(state: JobState) -> str:
    return state.name.lower()


def message_dict(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        msg, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )


def job_dict(job: Job) -> dict[str, Any]:
    return job.to_dict()


def at(moment: datetime | None) -> str:
    """A time as the tables show it (``-`` when unset)."""
    return when(round(moment.timestamp() * 1000) if moment else 0)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def print_job(job: Job) -> None:
    rows: list[tuple[str, object]] = [
        ("job_id", job.job_id),
        ("tenant", job.tenant_id),
        ("state", state_name(job.state) + (" (cancel requested)" if job.cancel_requested else "")),
        ("handler", job.handler),
        ("queue", job.queue),
        ("priority", job.priority),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("run_at", at(job.run_at)),
        ("created_at", at(job.created_at)),
        ("started_at", at(job.started_at)),
        ("finished_at", at(job.finished_at)),
        ("worker", job.worker_id or "-"),
        ("request_id", job.request_id),
        ("shard", job.shard_id),
        ("payload", _text(job.payload)),
    ]
    if job.next_attempt_at:
        rows.append(("next_attempt", at(job.next_attempt_at)))
    if job.progress:
        rows.append(("progress", f"{job.progress.fraction:.0%} {job.progress.message}".rstrip()))
    if job.error:
        rows.append(("last_error", job.error))
    if job.state is JobState.SUCCEEDED:
        rows.append(("result", _text(job.result)))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")


def print_jobs(jobs: Sequence[Job], next_page_token: str, dead: bool = False) -> None:
    headers = ["JOB_ID", "STATE", "HANDLER", "QUEUE", "PRIO", "ATTEMPTS", "RUN_AT", "CREATED"]
    rows: list[list[object]] = [
        [
            j.job_id,
            state_name(j.state),
            j.handler,
            j.queue,
            j.priority,
            f"{j.attempts}/{j.max_attempts}",
            at(j.run_at),
            at(j.created_at),
        ]
        for j in jobs
    ]
    if dead:
        headers.append("LAST_ERROR")
        for row, j in zip(rows, jobs, strict=True):
            row.append(" ".join((j.error or "").split())[:60])
    print_table(headers, rows)
    if next_page_token:
        print(f"\nmore: --page-token {next_page_token}")
