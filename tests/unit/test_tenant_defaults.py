"""The coordinator's admission defaults per tenant (``Coordinator.limits_for``): a tenant's
SHARDQ_TENANT_LIMITS entry over the defaults, as one object per tenant."""

from __future__ import annotations

from shardq.coordinator.app import Coordinator, CoordinatorSettings
from shardq.shard.models import TenantLimits


def _coordinator() -> Coordinator:
    # Nothing connects until the coordinator starts: the database URL is never dialled.
    return Coordinator(
        CoordinatorSettings(
            database_url="postgresql://db.invalid/shardq",
            default_limits=TenantLimits(max_pending=2, submit_burst=9),
            tenant_limits={"acme": TenantLimits(submit_rate_per_s=5, max_pending=3)},
        )
    )


def test_a_tenants_entry_is_laid_over_the_defaults() -> None:
    c = _coordinator()
    assert c.limits_for("acme") == TenantLimits(submit_rate_per_s=5, max_pending=3, submit_burst=9)
    assert c.limits_for("other") == TenantLimits(max_pending=2, submit_burst=9)


def test_each_tenant_gets_the_same_object_every_time() -> None:
    # The shard client checks a job's limits once per object in a row (ShardClient._checked):
    # a new object per job made every job of a SubmitJobs check them again.
    c = _coordinator()
    assert c.limits_for("acme") is c.limits_for("acme")
    assert c.limits_for("other") is c.limits_for("another") is c.settings.default_limits
