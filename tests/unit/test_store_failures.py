"""Which handler failures are the results database's (retried uncounted) and which are the
handler's own (worker/runtime.py ``_from_the_database`` and ``_permanent``)."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy.exc

from shardq.worker.handlers import HandlerSpec, PermanentFailure, Retry
from shardq.worker.runtime import _from_the_database, _permanent


def refused() -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError("SELECT 1", {}, psycopg.OperationalError("refused"))


def raised(make: object) -> Exception:
    try:
        make()  # type: ignore[operator]
    except Exception as exc:
        return exc
    raise AssertionError("nothing raised")


def wrapped() -> None:
    try:
        raise refused()
    except sqlalchemy.exc.OperationalError as exc:
        raise RuntimeError("ledger write failed") from exc


def handled_then_other() -> None:
    try:
        raise refused()
    except sqlalchemy.exc.OperationalError:
        raise ValueError("bad amount") from None


def permanent_while_handling() -> None:
    try:
        raise refused()
    except sqlalchemy.exc.OperationalError:
        raise PermanentFailure("no such account")  # noqa: B904 - the point of the test


class Mine(Exception):
    pass


def spec(retry: Retry | None = None) -> HandlerSpec:
    async def fn(ctx: object, payload: object) -> None:
        return None

    return HandlerSpec(name="h", fn=fn, mode="async", retry=retry)


@pytest.mark.parametrize(
    ("exc", "theirs"),
    [
        (refused(), True),
        (psycopg.OperationalError("too many clients already"), True),
        (sqlalchemy.exc.TimeoutError("QueuePool limit reached"), True),
        (raised(wrapped), True),
        (raised(handled_then_other), False),
        (ConnectionRefusedError("an HTTP call of the handler's"), False),
        (ValueError("bad"), False),
    ],
)
def test_what_counts_as_the_database_out_of_reach(exc: Exception, theirs: bool) -> None:
    assert _from_the_database(exc) is theirs


def test_a_permanent_failure_is_the_handlers_even_while_the_database_was_away() -> None:
    exc = raised(permanent_while_handling)
    assert _from_the_database(exc) and _permanent(exc, spec())
    assert _permanent(Mine(), spec(Retry(permanent=(Mine,))))
    assert not _permanent(Mine(), spec())
