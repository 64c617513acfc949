"""Checks, before any test runs, that the services the suite needs are there or can be had,
and says which ones it will use.

CI must fail with a clear message (never skip) when one is missing. Nothing is started here:
where no Postgres is configured or answers, the tests start one themselves
(tests/support/postgres.py), so this only checks that they can.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

from shardq.coordinator.tools.redis_server import RedisBinaryNotFound, find_redis_server
from tests.support.postgres import NoPostgres, configured_server


def _redis(problems: list[str]) -> None:
    try:
        binary = find_redis_server()
    except RedisBinaryNotFound as exc:
        problems.append(str(exc))
        return
    try:
        version = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        problems.append(f"{binary} does not run ({exc})")
        return
    print(f"preflight: redis-server: {binary} ({version})", file=sys.stderr)


def _postgres(problems: list[str]) -> None:
    try:
        found = configured_server()
    except NoPostgres as exc:
        problems.append(str(exc))
        return
    if found:
        url, what = found
        print(f"preflight: PostgreSQL: {what} at {url}", file=sys.stderr)
    elif importlib.util.find_spec("pgserver") is None:
        problems.append(
            "no PostgreSQL answers and the pgserver wheel is not installed: run `bash "
            ".ci/setup`, start PostgreSQL, or set SHARDQ_TEST_DATABASE_URL"
        )
    else:
        print(
            "preflight: PostgreSQL: none configured or answering; the tests start one "
            "(a Docker container where an engine runs, else the pgserver wheel's)",
            file=sys.stderr,
        )


def main() -> int:
    problems: list[str] = []
    _redis(problems)
    _postgres(problems)
    if os.path.isdir("helm") and any(os.scandir("helm")) and shutil.which("helm") is None:
        problems.append("helm is not on PATH: run `bash .ci/install-helm`")

    for p in problems:
        print(f"preflight: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
