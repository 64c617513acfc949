"""Tenant limits: the coordinator's defaults, the rows admins set, and what a tenant ends up with.

Each of the limits of ``shardq.v1.TenantLimits`` comes, field by field, from the first of
these that sets it (0 sets nothing):

1. the tenant's row in ``shardq_tenant_limits``, written by ``AdminService.SetTenantLimits``
   and pushed to the tenant's shard (its ``limits:{t}`` hash, which the shard enforces);
2. the tenant's entry in ``SHARDQ_TENANT_LIMITS`` (``--tenant-limits``);
3. that JSON's ``"*"`` entry;
4. the flags ``--max-pending``, ``--rate-per-s``, ``--submit-burst``, ``--max-pending-bytes``;
5. the shard's own: weight 1, no other limit (a burst of ``max(1, rate)``).

2 to 4 are the coordinator's *defaults* (``Coordinator.limits_for``): they travel with every submit
and the shard uses them where the tenant's hash has no value. So they cover the admission
limits only (rate, burst, pending jobs and bytes). The weight and the active-job cap are read
by claims, which workers make without the coordinator: those come from a row alone.

Two limits are not about admission or claims: ``dedupe_window_s`` (pushed to the shard, whose
``enqueue.lua`` reads it from the tenant's hash on every submit; else the shard settings' 24 h)
``result_retention_s`` (read from the row by the purge, ``shardq.coordinator.retention``; else
``--result-retention-s``) and ``max_watch_streams`` (read from the row by the gate when a stream
opens, ``shardq.coordinator.gate``; else ``--max-streams-per-tenant``). They come from a row
alone, and the server's value otherwise.

A coordinator that starts pushes nothing: every shard keeps the limits it was last given.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from shardq.common import validation
from shardq.common.errors import InvalidArgument
from shardq.shard.client import check_limits
from shardq.shard.models import TenantLimits
from shardq.store import db

#: Field names of TenantLimits, in the order of the message.
FIELDS = tuple(f.name for f in dataclasses.fields(TenantLimits))
#: The limits the coordinator's defaults may set (see the module's docstring).
ADMISSION_FIELDS = ("submit_rate_per_s", "submit_burst", "max_pending", "max_pending_bytes")
#: Names SHARDQ_TENANT_LIMITS has accepted before the limits had their proto names.
JSON_ALIASES = {"rate_per_s": "submit_rate_per_s"}


def check(limits: TenantLimits, prefix: str = "limits.") -> TenantLimits:
    """``limits`` if every field is in the range a shard accepts (``shard.client.check_limits``:
    weight 0-1000, the rate finite in [0, 1e9), counts up to 2^53), else InvalidArgument
    naming ``<prefix><field>``."""
    try:
        checked = check_limits(limits)
    except InvalidArgument as exc:
        raise InvalidArgument(exc.message, field=f"{prefix}{exc.field}") from exc
    return dataclasses.replace(checked, submit_rate_per_s=checked.submit_rate_per_s + 0.0)


def overlay(base: TenantLimits, top: TenantLimits) -> TenantLimits:
    """``top``'s fields where set (not 0), ``base``'s elsewhere."""
    return TenantLimits(**{f: getattr(top, f) or getattr(base, f) for f in FIELDS})


def effective(
    limits: TenantLimits,
    result_retention_s: int = 0,
    dedupe_window_s: int = 0,
    max_watch_streams: int = 0,
) -> TenantLimits:
    """``limits`` with the shard's own defaults where still unset: weight 1; and the server's
    result retention, dedupe window and stream cap (which no job carries: the purge, the
    shard's ``enqueue.lua`` and the coordinator's gate apply them)."""
    return dataclasses.replace(
        limits,
        weight=limits.weight or 1,
        result_retention_s=limits.result_retention_s or result_retention_s,
        dedupe_window_s=limits.dedupe_window_s or dedupe_window_s,
        max_watch_streams=limits.max_watch_streams or max_watch_streams,
    )


def parse_tenant_limits(
    raw: str, flags: TenantLimits
) -> tuple[TenantLimits, dict[str, TenantLimits]]:
    """SHARDQ_TENANT_LIMITS over the flags: (everyone's defaults, each listed tenant's entry);
    ValueError saying what is wrong.

    ``{"*": {"max_pending": 10000}, "acme": {"max_pending": 1000, "submit_rate_per_s": 50}}``:
    each entry may set ``submit_rate_per_s`` (or its old name ``rate_per_s``),
    ``submit_burst``, ``max_pending`` and ``max_pending_bytes``.
    """
    try:
        flags = check(flags, prefix="")
    except InvalidArgument as exc:
        raise ValueError(f"a default limit flag: {exc}") from exc
    doc = json.loads(raw) if raw else {}
    if not isinstance(doc, dict):
        raise ValueError("SHARDQ_TENANT_LIMITS: not a JSON object of tenant -> limits")
    everyone = overlay(flags, _entry("*", doc.get("*", {})))
    tenants = {}
    for tenant, spec in doc.items():
        if tenant == "*":
            continue
        try:
            validation.tenant_id(tenant)
        except InvalidArgument as exc:
            raise ValueError(f"SHARDQ_TENANT_LIMITS: {exc.message}") from exc
        tenants[tenant] = _entry(tenant, spec)
    return everyone, tenants


def _entry(tenant: str, spec: Any) -> TenantLimits:
    where = f"SHARDQ_TENANT_LIMITS[{tenant!r}]"
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: not a JSON object of limits")
    values: dict[str, Any] = {}
    for key, value in spec.items():
        name = JSON_ALIASES.get(key, key)
        if name not in ADMISSION_FIELDS:
            hint = (
                " (set it with SetTenantLimits or `shardq tenants set`: claims read it from the "
                "shard)"
                if name in FIELDS
                else ""
            )
            raise ValueError(f"{where}: {key!r} is not a default limit{hint}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}: {key} is not a number")
        values[name] = value if name == "submit_rate_per_s" else _whole(value, where, key)
    try:
        return check(TenantLimits(**values), prefix="")
    except InvalidArgument as exc:
        raise ValueError(f"{where}: {exc}") from exc


def _whole(value: int | float, where: str, key: str) -> int:
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{where}: {key} is not a whole number")
    return int(value)


class LimitsStore:
    """The ``shardq_tenant_limits`` rows: each tenant's limits as an admin set them."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def get(self, tenant: str) -> TenantLimits | None:
        t = db.tenant_limits
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    sa.select(*(t.c[f] for f in FIELDS)).where(t.c.tenant_id == tenant)
                )
            ).first()
        return None if row is None else TenantLimits(**row._asdict())

    async def put(self, tenant: str, limits: TenantLimits) -> None:
        """Replace the tenant's row (every field; 0 = the default)."""
        values = {f: getattr(limits, f) for f in FIELDS}
        t = db.tenant_limits
        stmt = insert(t).values(tenant_id=tenant, updated_at=sa.func.now(), **values)
        stmt = stmt.on_conflict_do_update(
            index_elements=[t.c.tenant_id], set_={**values, "updated_at": sa.func.now()}
        )
        async with self.engine.begin() as conn:
            await conn.execute(stmt)
