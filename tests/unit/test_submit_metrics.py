"""The submit metrics' tenant label: at most N tenants of their own plus ``other``, the
busiest of each period, and no label at all by default (coordinator/metrics.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from shardq.coordinator.metrics import SubmitMetrics


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def tenants_shown(registry: CollectorRegistry) -> set[str]:
    return {
        s.labels["tenant"]
        for family in registry.collect()
        for s in family.samples
        if "tenant" in s.labels
    }


def submitted(registry: CollectorRegistry, tenant: str) -> float | None:
    return registry.get_sample_value("shardq_coordinator_jobs_submitted_total", {"tenant": tenant})


def test_without_top_tenants_no_metric_has_a_tenant_label() -> None:
    registry = CollectorRegistry()
    m = SubmitMetrics(registry)
    m.one("acme", deduplicated=False)
    m.one("acme", deduplicated=True)
    m.count("globex", 2, 0, {"RESOURCE_EXHAUSTED": 3})
    assert tenants_shown(registry) == set()
    assert registry.get_sample_value("shardq_coordinator_jobs_submitted_total") == 3
    assert registry.get_sample_value("shardq_coordinator_dedupe_hits_total") == 1
    refused = registry.get_sample_value(
        "shardq_coordinator_submit_refused_total", {"code": "RESOURCE_EXHAUSTED"}
    )
    assert refused == 3


def test_the_first_n_tenants_get_labels_then_the_busiest_of_each_period_keep_them() -> None:
    registry, clock = CollectorRegistry(), Clock()
    m = SubmitMetrics(registry, top_tenants=2, period_s=60, clock=clock)
    m.count("a", 1, 0)
    m.count("b", 1, 0, {"INVALID_ARGUMENT": 1})
    m.count("c", 5, 0)  # the slots are taken: other
    assert tenants_shown(registry) == {"a", "b", "other"}
    assert submitted(registry, "other") == 5

    # A period ends at the first call after it (that call counts in it): c and b were the
    # busiest, so a loses its series and c gets its own, from that call on.
    clock.now = 61
    m.count("c", 1, 0)
    assert tenants_shown(registry) == {"b", "c", "other"}
    assert submitted(registry, "c") == 1
    assert submitted(registry, "a") is None
    assert submitted(registry, "other") == 5  # c's jobs from before it had a label

    # Next period a is busier than b: b loses every series of its own, refusals included.
    clock.now = 62
    m.count("a", 3, 0)  # still other
    clock.now = 130
    m.count("c", 1, 0)
    assert tenants_shown(registry) == {"c", "other"}
    assert submitted(registry, "b") is None
    refused_b = {"tenant": "b", "code": "INVALID_ARGUMENT"}
    assert registry.get_sample_value("shardq_coordinator_submit_refused_total", refused_b) is None
    m.count("a", 1, 0)
    assert submitted(registry, "a") == 1
    assert submitted(registry, "other") == 5 + 3


def test_quiet_tenants_keep_their_labels_while_fewer_than_n_are_busy() -> None:
    registry, clock = CollectorRegistry(), Clock()
    m = SubmitMetrics(registry, top_tenants=3, period_s=60, clock=clock)
    m.count("a", 1, 0)
    m.count("b", 1, 0)
    clock.now = 61
    m.count("b", 1, 0)  # a was quiet for a period, but there is room: it keeps its label
    clock.now = 122
    m.count("b", 1, 0)
    assert tenants_shown(registry) == {"a", "b"}
