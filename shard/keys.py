"""Every Redis key shardq uses on a shard, in one place.

All keys share one configurable prefix (``SHARDQ_KEY_PREFIX``, default ``shardq``). Keys that
embed a tenant ID only ever embed a validated one (``[A-Za-z0-9._-]{1,64}``, see
:mod:`shard.validation`), so a tenant can never address another tenant's keys.

Lua scripts receive the keys they touch in ``KEYS``. Per-tenant and per-queue keys that a
script can only discover while it runs (the next tenant in a round-robin ring, the tenant and
queue of a promoted job) are derived inside Lua from ``KEYS[1]``, which is always
:meth:`Keys.base` (the prefix plus ``:``); the Lua helpers in ``shard/lua/_lib.lua`` build them
with the same spelling as the methods below. Changing a spelling here means changing it there:
``tests/unit/test_keys.py`` checks that both agree.

A job's hash uses short field names to keep a scheduled job small in memory; they are listed
in :data:`JOB_FIELDS`, and declared with the job's states in :mod:`shard.records`.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardq.shard.records import JOB_FIELD_DOCS, STATES, TERMINAL_STATES

__all__ = ["JOB_FIELDS", "STATES", "TERMINAL_STATES", "Keys"]

#: Field names of the job hash ``{prefix}:job:{job_id}`` and what each holds (the layout is
#: declared in :mod:`shard.records`, with the records that read and write it).
JOB_FIELDS: dict[str, str] = {f.value: doc for f, doc in JOB_FIELD_DOCS.items()}


@dataclass(frozen=True, slots=True)
class Keys:
    """Key builder for one shard's Redis. Every method returns one key; its Redis type is noted."""

    prefix: str = "shardq"

    def base(self) -> str:
        """The prefix plus ``:``; passed as KEYS[1] so Lua can derive per-tenant keys."""
        return f"{self.prefix}:"

    def job(self, job_id: str) -> str:
        """HASH: one job (fields in :data:`JOB_FIELDS`)."""
        return f"{self.prefix}:job:{job_id}"

    def scheduled_by_tenant(self, tenant: str) -> str:
        """ZSET: one tenant's scheduled job IDs (not yet due) by run-at (unix ms): the only
        entry a scheduled job has besides its hash. Promote, listing and moves range it."""
        return f"{self.prefix}:tscheduled:{tenant}"

    def due(self) -> str:
        """ZSET: the tenants with scheduled jobs, each scored at or before its earliest run-at
        (unix ms): the shard loop's order across tenants (``promote.lua`` merges the tenants'
        :meth:`scheduled_by_tenant` ZSETs by it). A score may be early, never late: a cancel or
        a move that takes a tenant's earliest job leaves it, and promote sets it right when it
        comes due (``due_by`` and ``undue_if_empty`` in ``_lib.lua``)."""
        return f"{self.prefix}:due"

    def active_by_tenant(self, tenant: str) -> str:
        """ZSET: one tenant's active job IDs scored by claim time (unix ms), for listing."""
        return f"{self.prefix}:tactive:{tenant}"

    # -- ready jobs and who may be served (claim.lua; docs/queues-and-limits.md) --------------
    #
    # A tenant ``t`` is on ``ring(q)`` only if it has ready jobs in ``q``. Claim drops the head
    # tenant lazily when it finds it paused (``paused``, ``tqpaused``) or parked (``parked``);
    # a resume or an un-park puts it back on the ring of each queue in ``tqueues(t)``.

    def ready(self, tenant: str, queue: str, priority: int) -> str:
        """LIST: ready job IDs of one tenant in one queue at one priority, FIFO (RPUSH, LPOP).

        May hold IDs of jobs cancelled while ready: claim skips them (lazy removal keeps
        cancel O(1) however long the list is).
        """
        return f"{self.prefix}:ready:{tenant}:{queue}:{priority}"

    def priorities(self, tenant: str, queue: str) -> str:
        """ZSET: the priorities whose :meth:`ready` list of the tenant and queue is not empty
        (member and score the priority): claim reads the highest in O(1)."""
        return f"{self.prefix}:tprio:{tenant}:{queue}"

    def queues(self, tenant: str) -> str:
        """SET: the queues where the tenant has ready jobs (a non-empty :meth:`priorities`)."""
        return f"{self.prefix}:tqueues:{tenant}"

    def ring(self, queue: str) -> str:
        """LIST: tenants with ready jobs in the queue, in round-robin order (tenants first)."""
        return f"{self.prefix}:qring:{queue}"

    def in_ring(self, queue: str) -> str:
        """SET: the members of :meth:`ring`, so that a tenant is never on a ring twice."""
        return f"{self.prefix}:inring:{queue}"

    def credit(self, queue: str) -> str:
        """HASH: tenant -> jobs claimed in its current turn in the queue (weights > 1)."""
        return f"{self.prefix}:qcredit:{queue}"

    def limits(self, tenant: str) -> str:
        """HASH: the tenant's limits (``ShardClient.set_limits``), a field per limit set:
        ``weight``, ``max_active``, ``rate``, ``burst``, ``max_pending``,
        ``max_pending_bytes``, ``dedupe`` (the dedupe window, s). An absent field takes the
        caller's default (enqueue's ARGV) or, for ``weight`` and ``max_active``, none (weight
        1, no cap)."""
        return f"{self.prefix}:limits:{tenant}"

    def paused(self) -> str:
        """SET: tenants paused whole: nothing of theirs is claimed."""
        return f"{self.prefix}:paused"

    def paused_queues(self) -> str:
        """SET: queues paused for every tenant of the shard: claim skips them."""
        return f"{self.prefix}:qpaused"

    def paused_tenant_queues(self) -> str:
        """SET: ``{tenant}/{queue}`` of one tenant's queue paused."""
        return f"{self.prefix}:tqpaused"

    def parked(self) -> str:
        """SET: tenants at their ``max_active`` cap: claim takes them off every ring, and the
        script that ends one of their active jobs below the cap puts them back."""
        return f"{self.prefix}:parked"

    def leases(self) -> str:
        """ZSET: active job IDs scored by lease deadline (unix ms); the reaper ranges it."""
        return f"{self.prefix}:leases"

    def wait_mark(self) -> str:
        """STRING (integer): written just before each WAIT for replicas (``ShardClient``), so
        the WAIT covers every write the primary holds, even after a script that wrote nothing
        on this connection (a WAIT counts only the connection's own writes: alone, it could
        pass at once while an earlier, unreplicated write of another connection waits)."""
        return f"{self.prefix}:waitmark"

    def fence(self) -> str:
        """STRING (integer): the shard's fencing-token counter; every claim takes a new one."""
        return f"{self.prefix}:fence"

    def dead(self, tenant: str) -> str:
        """ZSET: one tenant's dead job IDs, scored by the time they died (unix ms)."""
        return f"{self.prefix}:dead:{tenant}"

    def outbox(self) -> str:
        """ZSET: IDs of jobs that ended (dead, cancelled) with no worker writing their result
        row, scored by when they ended (unix ms): the reaper's dead and cancelled jobs, jobs
        cancelled while scheduled or ready, and active jobs whose cancel won over their ack or
        fail. Added to in the script that ends the job; the leading shard loop writes the rows
        (:mod:`shard.rows`) and takes the IDs off after the commit (``rows_written.lua``)."""
        return f"{self.prefix}:outbox"

    def dedupe(self, tenant: str, request_id: str) -> str:
        """STRING ``"{job_id} {digest}"`` with a TTL: the tenant's dedupe window (``limits:{t}``
        ``dedupe``, s) or ``ShardSettings.dedupe_ttl_ms``, set when the job is accepted; at job
        format 3 (``job_format``) set only when the job ends, for what is left of the window
        counted from its submit (none when nothing is)."""
        return f"{self.prefix}:dedupe:{tenant}:{request_id}"

    def counts(self, tenant: str) -> str:
        """HASH: per-tenant gauges and counters, kept in O(1) by every script.

        Gauges: ``scheduled``, ``ready``, ``active``, ``dead``, and ``bytes`` (payload bytes
        of the scheduled, ready and active jobs; never below 0, see ``docs/queues-and-limits.md``
        on upgraded shards). Counters (only grow): ``submitted``, ``succeeded``, ``failed``
        (attempts that failed or expired), ``unrunnable`` (jobs handed back by a worker
        without their handler).
        """
        return f"{self.prefix}:counts:{tenant}"

    def tenants(self) -> str:
        """SET: every tenant that has or had jobs on this shard."""
        return f"{self.prefix}:tenants"

    def load(self) -> str:
        """HASH: tenant -> its last load sample, compact JSON, written by the shard loop.

        ``{"at_ms", "submitted", "succeeded", "failed"}`` are the tenant's counters (from
        :meth:`counts`) when sampled at ``at_ms``; ``submit_per_s``, ``complete_per_s`` and
        ``fail_per_s`` are their rates since the sample before (absent on a tenant's first
        sample). Kept in Redis so a new leader goes on from the old one's last sample. Written
        only by :mod:`shard.load`, never by a Lua script: the hot path does no extra work.
        """
        return f"{self.prefix}:load"

    def bucket(self, tenant: str) -> str:
        """HASH ``{tokens, ts}``: the tenant's submit-rate token bucket."""
        return f"{self.prefix}:bucket:{tenant}"

    def wake(self, queue: str) -> str:
        """LIST: wake-up tokens for idle workers of the queue (BLPOP), capped in length."""
        return f"{self.prefix}:wake:{queue}"

    def promoter_wake(self) -> str:
        """LIST: wake-up tokens for the shard loop when a job earlier than the next due arrives."""
        return f"{self.prefix}:promoter_wake"

    def leader(self) -> str:
        """STRING: the instance ID of the shard loop holding the leader lease (with a TTL)."""
        return f"{self.prefix}:leader"

    def schedules(self, tenant: str) -> str:
        """HASH: schedule ID -> JSON spec of one tenant's recurring schedules."""
        return f"{self.prefix}:schedules:{tenant}"

    def cron(self) -> str:
        """ZSET: ``{tenant}/{schedule_id}`` scored by its next tick (unix ms)."""
        return f"{self.prefix}:cron"

    # -- moving a tenant to another shard (coordinator/mover.py, the move_*.lua scripts) -----

    def map_fence(self) -> str:
        """STRING (integer): the lowest shard-map version whose submits this shard accepts.

        Raised on a move's source shard before the move is committed, so a coordinator that
        has not yet seen the move is told to reload the map instead of adding work here.
        """
        return f"{self.prefix}:mapfence"

    def job_format(self) -> str:
        """STRING (integer): the job-hash format ``enqueue.lua`` writes on this shard
        (:data:`shard.records.JOB_FORMAT`); absent: 1. Raised, never lowered, by ``shardq
        shards finalize`` once every pod runs a release that reads the higher format (a first
        install's hook, the operator after an upgrade), by ``shardq dev``, and on a move's
        target to its source's: 2 leaves ``pr``, ``ma`` and ``to`` out of a job hash at their
        usual value; 3 gives a job the ID ``derived_job_id(tenant, request_id)`` and no dedupe
        key until it ends (its hash's ``d`` is the record meanwhile)."""
        return f"{self.prefix}:jobformat"

    def identity(self) -> str:
        """STRING: the ID of the shard this Redis holds the data of, written when the shard
        map first names this address (``coordinator/shardcheck.py``): a re-pointed address
        must hold the same shard's data, and a new shard's address none of another's."""
        return f"{self.prefix}:identity"

    def moving(self, tenant: str) -> str:
        """SET: IDs of a moving tenant's jobs taken off this (source) shard's queues and not
        yet deleted here: copied to the target, or about to be. A crashed mover resumes here."""
        return f"{self.prefix}:moving:{tenant}"

    def moving_schedules(self, tenant: str) -> str:
        """HASH: schedule ID -> ``"{next_tick_ms} {fired 0|1} {JSON spec}"`` of a moving
        tenant's recurring schedules, taken off this source shard, until the target has them."""
        return f"{self.prefix}:movingsched:{tenant}"

    def moved_counts(self, tenant: str) -> str:
        """HASH: a moved tenant's counters, set aside on the source until the target adds them."""
        return f"{self.prefix}:movedcounts:{tenant}"

    def moved_in(self, tenant: str, move_id: str) -> str:
        """STRING with a TTL: on the target, "this move's counters were added" (exactly once)."""
        return f"{self.prefix}:movedin:{tenant}:{move_id}"

    # -- earlier layouts: before queues (read only by upgrade_layout.lua), before `due` ------

    def old_ready(self, tenant: str, priority: int) -> str:
        """LIST (previous layout): ready job IDs of a tenant at a priority, all in one queue."""
        return f"{self.prefix}:ready:{tenant}:{priority}"

    def old_ring(self, priority: int) -> str:
        """LIST (previous layout): tenants with ready jobs at this priority."""
        return f"{self.prefix}:ring:{priority}"

    def old_credit(self, priority: int) -> str:
        """HASH (previous layout): tenant -> jobs claimed in its turn at this priority."""
        return f"{self.prefix}:credit:{priority}"

    def old_weights(self) -> str:
        """HASH (previous layout): tenant -> fairness weight; now ``limits:{t}`` ``weight``."""
        return f"{self.prefix}:weights"

    def old_wake(self) -> str:
        """LIST (previous layout): the one wake-up list of all workers."""
        return f"{self.prefix}:wake"

    def old_scheduled(self) -> str:
        """ZSET (the layout before :meth:`due`): every scheduled job of the shard by run-at,
        a second entry per job beside its tenant's. ``promote.lua`` moves what a shard of an
        earlier version still holds onto :meth:`due`."""
        return f"{self.prefix}:scheduled"
