"""The job the rq workers run (imported by `rq worker` from this directory)."""

from _common import record_start


def noop(number: int) -> None:
    record_start(number)
