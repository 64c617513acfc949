"""Structured logs: one valid JSON object per line, job IDs carried, odd messages escaped."""

from __future__ import annotations

import json
import logging

from shardq.common.config import JsonFormatter


def record(msg: str, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("shardq.worker", logging.WARNING, __file__, 1, msg, None, None)
    rec.__dict__.update(extra)
    return rec


def test_a_log_line_is_json_with_the_jobs_ids() -> None:
    line = JsonFormatter().format(record('lease "lost"\nagain', job_id="J1", tenant="acme"))
    doc = json.loads(line)
    assert "\n" not in line
    assert (doc["msg"], doc["job_id"], doc["tenant"], doc["level"]) == (
        'lease "lost"\nagain', "J1", "acme", "WARNING",
    )  # fmt: skip


def test_fields_a_record_does_not_carry_are_left_out() -> None:
    doc = json.loads(JsonFormatter().format(record("plain")))
    assert set(doc) == {"ts", "level", "logger", "msg"}
