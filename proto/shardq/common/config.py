"""Settings from flags with ``SHARDQ_*`` environment variables as their defaults.

Every component reads its settings this way, so a flag and its variable always agree:
``--leader-ttl-ms`` is ``SHARDQ_LEADER_TTL_MS``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Any
from urllib.parse import quote


def env_name(flag: str) -> str:
    return "SHARDQ_" + flag.lstrip("-").replace("-", "_").upper()


def add(
    parser: argparse.ArgumentParser, flag: str, default: Any, help: str, type: Any = str
) -> None:
    """Add ``flag`` whose default comes from its SHARDQ_ variable, else ``default``."""
    var = env_name(flag)
    raw = os.environ.get(var)
    value = type(raw) if raw not in (None, "") else default
    parser.add_argument(flag, default=value, type=type, help=f"{help} [{var}; default {default!r}]")


def redis_url_with_password(url: str, password: str) -> str:
    """Put a password from the environment into a redis:// URL that has none."""
    if not password or "@" in url.split("//", 1)[-1]:
        return url
    scheme, rest = url.split("//", 1)
    return f"{scheme}//:{quote(password, safe='')}@{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the job's IDs when a log call carries them (``extra=``).
    Payloads and tokens are never logged by shardq, so none can appear here."""

    FIELDS = ("job_id", "tenant", "handler", "shard", "worker_id")

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({f: getattr(record, f) for f in self.FIELDS if hasattr(record, f)})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str) -> None:
    """Structured logs on stderr for every shardq process."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler])
