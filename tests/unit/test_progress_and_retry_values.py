"""What a handler may pass to ``ctx.progress`` and ``Retry(...)``: checked where it is written,
with a ValueError that says what is wrong (the runs themselves: tests/integration/
test_progress.py and test_retry_policy.py)."""

from __future__ import annotations

from typing import Any

import pytest

from shardq.shard.backoff import Backoff
from shardq.shard.records import JobProgress
from shardq.worker import Retry
from shardq.worker.context import check_progress


@pytest.mark.parametrize(
    ("fraction", "message"), [(0, ""), (1, "done"), (0.4, "resized 4/10"), (0.5, "é" * 256)]
)
def test_a_report_in_range_is_taken_as_given(fraction: float, message: str) -> None:
    assert check_progress(fraction, message) == JobProgress(float(fraction), message)


@pytest.mark.parametrize(
    ("fraction", "message", "says"),
    [
        (1.01, "", "from 0 to 1, not 1.01"),
        (-0.5, "", "from 0 to 1, not -0.5"),
        (float("nan"), "", "from 0 to 1, not nan"),
        (float("inf"), "", "from 0 to 1, not inf"),
        ("0.5", "", "must be a number"),
        (True, "", "must be a number"),
        (None, "", "must be a number"),
        (0.5, "x" * 257, "257 characters, at most 256"),
        (0.5, 42, "must be a str"),
        (0.5, "a\0b", "NUL"),
        (0.5, "\ud800", "not valid text"),
    ],
)
def test_a_bad_report_is_a_value_error_saying_why(fraction: Any, message: Any, says: str) -> None:
    with pytest.raises(ValueError, match="progress") as err:
        check_progress(fraction, message)
    assert says in str(err.value)


def test_a_retry_fills_what_it_leaves_unset_from_the_default() -> None:
    default = Backoff()
    assert Retry().over(default) == default
    assert Retry(base=0.25).over(default) == Backoff(250, 3_600_000, 1.0)
    assert Retry(base=1, max=60, jitter=0).over(default) == Backoff(1_000, 60_000, 0.0)


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"base": 0}, "Retry.base must be from 0.001"),
        ({"base": -1.0}, "Retry.base must be from 0.001"),
        ({"max": float("inf")}, "Retry.max must be from 0.001"),
        ({"base": 10.0, "max": 5.0}, "Retry.max (5.0) is below Retry.base (10.0)"),
        ({"jitter": 1.5}, "Retry.jitter must be from 0 to 1"),
        ({"permanent": ValueError}, "a tuple of exception types"),
        ({"permanent": (ValueError, "KeyError")}, "a tuple of exception types"),
    ],
)
def test_a_bad_retry_is_refused_when_the_handler_is_declared(kw: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError) as err:
        Retry(**kw)
    assert says in str(err.value)
