"""Checks, before any test runs, that the services the suite needs are there.

CI must fail with a clear message (never skip) when one is missing.
"""

from __future__ import annotations

import os
import shutil
import sys

import psycopg

from shardq.coordinator.tools.redis_server import RedisBinaryNotFound, find_redis_server


def main() -> int:
    problems: list[str] = []
    try:
        find_redis_server()
    except RedisBinaryNotFound as exc:
        problems.append(str(exc))

    url = os.environ.get(
        "SHARDQ_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        problems.append(
            f"PostgreSQL is not reachable at {url} ({exc}); start it, or set "
            "SHARDQ_TEST_DATABASE_URL"
        )

    if os.path.isdir("helm") and any(os.scandir("helm")) and shutil.which("helm") is None:
        problems.append("helm is not on PATH: run `bash .ci/install-helm`")

    for p in problems:
        print(f"preflight: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
