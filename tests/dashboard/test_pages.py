"""The dashboard's pieces without a cluster: every template parses, the payload is shown as
indented JSON and cut where it is large, and the chart series never shows a negative rate."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from shardq.coordinator.dashboard.app import PAYLOAD_SHOWN_BYTES, _env, pretty_json
from shardq.coordinator.dashboard.samples import Sample, Samples
from shardq.coordinator.dashboard.sessions import Session, SessionStore, same

TEMPLATES = sorted(
    p.name
    for p in (resources.files("shardq.coordinator.dashboard") / "templates").iterdir()
    if p.name.endswith(".html")
)


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_template_parses(name: str) -> None:
    _env().get_template(name)


def test_payload_is_indented_and_cut_when_large() -> None:
    assert pretty_json(b'{"a":[1,2]}') == ('{\n  "a": [\n    1,\n    2\n  ]\n}', False)
    assert pretty_json(b"") == ("null", False)
    assert pretty_json(b"not json") == ("not json", False)
    big = json.dumps({"k": "é" * PAYLOAD_SHOWN_BYTES}).encode()
    shown, cut = pretty_json(big)
    assert cut and len(shown.encode()) <= PAYLOAD_SHOWN_BYTES


def test_a_document_nested_past_pythons_recursion_is_shown_as_it_came() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    assert pretty_json(deep, limit=10) == ("[[[[[[[[[[", True)


@pytest.mark.parametrize("interval_s", [0.0, 0.1, float("nan"), 1e9])
def test_a_sample_interval_out_of_range_is_refused(interval_s: float) -> None:
    with pytest.raises(ValueError, match="sample interval"):
        Samples(interval_s=interval_s)


def test_a_sessions_repr_shows_neither_its_token_nor_its_csrf_secret() -> None:
    session = Session(token="sq_secret_token", role="admin", tenant="")
    assert "sq_secret_token" not in repr(session) and session.csrf not in repr(session)


def test_series_rates_and_a_counter_that_went_down() -> None:
    s = Samples(interval_s=5)
    s.add(Sample(0.0, 100, 50, 1, 0))
    s.add(Sample(5.0, 150, 60, 1, 20))
    s.add(Sample(10.0, 120, 70, 2, 0))  # a tenant moved away: its counters went with it
    series = s.series()
    assert series["submitted"] == [10.0, None]
    assert series["completed"] == [2.0, 2.0]
    assert series["lateness_ms"] == [20, 0]
    assert s.ring.maxlen == 3600 // 5 + 1  # one hour, bounded


def test_sessions_are_found_by_their_id_only_and_end() -> None:
    store = SessionStore(idle_s=3600, max_sessions=2)
    a = store.create(Session(token="sq_a", role="admin", tenant=""))
    b = store.create(Session(token="sq_b", role="tenant", tenant="acme"))
    assert store.get(a) is not None and store.get(a).token == "sq_a"  # type: ignore[union-attr]
    assert store.get("sq_a") is None and store.get("") is None
    store.get(b)  # b is now the most recent: a third login pushes a out
    store.create(Session(token="sq_c", role="tenant", tenant="globex"))
    assert store.get(a) is None and store.get(b) is not None
    store.drop(b)
    assert store.get(b) is None
    assert same("x", "x") and not same("", "") and not same("x", "y")


class ManualClock:
    """The store's clock, moved by the test: expiry is checked without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_ends_at_its_lifetime_however_active() -> None:
    clock = ManualClock()
    store = SessionStore(idle_s=600, max_age_s=3600, clock=clock)
    session = Session(token="sq_a", role="admin", tenant="")
    sid = store.create(session)
    for _ in range(11):  # a request every 5 minutes: never idle
        clock.now += 300
        assert store.get(sid) is session
    assert store.deadline(session) == 1000.0 + 3600  # the lifetime, not the idle limit
    clock.now = 1000.0 + 3600
    assert store.get(sid) is None
    assert session.ended.is_set()  # its live streams wait on this


def test_a_session_ends_when_idle_and_at_logout() -> None:
    clock = ManualClock()
    store = SessionStore(idle_s=600, max_age_s=3600, clock=clock)
    idle, out = Session(token="sq_a", role="admin", tenant=""), Session("sq_b", "tenant", "x")
    idle_id, out_id = store.create(idle), store.create(out)
    clock.now += 599
    assert store.alive(idle) and not idle.ended.is_set()
    store.drop(out_id)
    assert out.ended.is_set() and store.get(out_id) is None
    clock.now += 1
    assert not store.alive(idle) and idle.ended.is_set() and store.get(idle_id) is None
