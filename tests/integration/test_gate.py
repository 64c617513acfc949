"""The front door's gate (coordinator/gate.py) on a real coordinator process: what a caller
without a valid token, or over a cap, costs it — measured as the process's own peak memory and
its own count of token lookups."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import grpc
import pytest

from shardq.client import AsyncClient, RetryPolicy, TenantLimits
from shardq.v1 import common_pb2, jobs_pb2, jobs_pb2_grpc
from tests.integration.test_frontdoor_metrics import scrape, tokens, value
from tests.support.coordinator_proc import CoordinatorProcess, coordinator_process, one_shard

MB = 1_000_000


def memory_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak since the last reset) of a process, in kB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(rest.split()[0])
    return fields


def reset_peak(pid: int) -> None:
    # Linux: writing 5 to clear_refs resets VmHWM to the current RSS.
    Path(f"/proc/{pid}/clear_refs").write_text("5")


async def submit_raw(target: str, token: str | None, payload: bytes) -> grpc.StatusCode:
    """One SubmitJob of ``payload`` with ``token`` (none: no authorization header)."""
    md = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(
        target, options=[("grpc.max_send_message_length", -1)]
    ) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        request = jobs_pb2.SubmitJobRequest(
            job=common_pb2.JobSpec(handler="test.work", payload=payload)
        )
        try:
            await stub.SubmitJob(request, metadata=md, timeout=60)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def test_an_unauthenticated_60_mb_call_is_refused_before_it_is_read(
    database_url: str,
) -> None:
    async with one_shard(database_url) as (_, admin):
        (token,) = await tokens(database_url, "acme")
        # A receive limit over the call's size: what stops it must be the gate, not gRPC.
        async with coordinator_process(
            database_url, admin, max_request_bytes=128 * MB
        ) as coordinator:
            pid = coordinator.proc.pid
            payload = b"x" * (60 * MB)
            await submit_raw(coordinator.target, None, b"{}")  # warm up the call path
            for who in (None, "sq_0123456789ab_" + "B" * 43):
                reset_peak(pid)
                before = memory_kb(pid)["VmRSS"]
                code = await submit_raw(coordinator.target, who, payload)
                assert code == grpc.StatusCode.UNAUTHENTICATED, who
                grew_kb = memory_kb(pid)["VmHWM"] - before
                # A third of the payload: the transport's buffers and the allocator's noise
                # took up to 8.2 MB here; a call that is read takes all 60 (below).
                assert grew_kb < 20_000, f"{who}: the refused call cost {grew_kb} kB"
            # The measure can tell: an authenticated call of the same size is read (and then
            # refused for its payload's size), and the peak shows it.
            reset_peak(pid)
            before = memory_kb(pid)["VmRSS"]
            code = await submit_raw(coordinator.target, token, payload)
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert memory_kb(pid)["VmHWM"] - before > 50_000
            coordinator.check_alive()


async def test_ten_thousand_random_tokens_cost_a_bounded_number_of_lookups(
    database_url: str,
) -> None:
    async with one_shard(database_url) as (_, admin):
        (token,) = await tokens(database_url, "acme")
        async with (
            coordinator_process(database_url, admin) as coordinator,
            AsyncClient(coordinator.target, token, retry=RetryPolicy(attempts=1)) as acme,
        ):
            await acme.submit("test.work", {}, request_id="seen")  # the token is now known
            lookups = "shardq_coordinator_token_lookups_total"
            start = value(await scrape(coordinator), lookups)
            loop = asyncio.get_running_loop()
            began = loop.time()
            codes = await guess(coordinator, 10_000)
            elapsed = loop.time() - began
            m = await scrape(coordinator)
            spent = value(m, lookups) - start
            # 20 at once from one address, then 1 per second (GateSettings' defaults).
            assert spent <= 20 + elapsed + 2, (spent, elapsed)
            assert codes[grpc.StatusCode.UNAUTHENTICATED] >= 20
            assert codes[grpc.StatusCode.RESOURCE_EXHAUSTED] >= 9_000, codes
            assert set(codes) == {
                grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
            }
            refused = "shardq_coordinator_gate_refused_total"
            assert (
                value(m, refused, reason="auth_throttled")
                == (codes[grpc.StatusCode.RESOURCE_EXHAUSTED])
            )
            # The known token from the same address is not locked out with the guesser.
            again = await acme.submit("test.work", {}, request_id="after")
            assert not again.deduplicated


async def guess(coordinator: CoordinatorProcess, n: int) -> dict[grpc.StatusCode, int]:
    """``n`` GetJob calls, each with a random well-formed token; their codes, counted."""
    codes: dict[grpc.StatusCode, int] = {}
    async with grpc.aio.insecure_channel(coordinator.target) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        request = jobs_pb2.GetJobRequest(job_id="0" * 26)

        async def one() -> None:
            forged = f"sq_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"
            try:
                await stub.GetJob(request, metadata=(("authorization", f"Bearer {forged}"),))
                code = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
            codes[code] = codes.get(code, 0) + 1

        for _ in range(n // 200):
            await asyncio.gather(*(one() for _ in range(200)))
    return codes


async def test_a_tenant_over_its_stream_cap_is_refused_and_others_are_not(
    database_url: str,
) -> None:
    """acme has the coordinator's default cap (2); other is given 3 through SetTenantLimits."""
    async with one_shard(database_url) as (_, admin_token):
        acme_token, other_token = await tokens(database_url, "acme", "other")
        async with (
            coordinator_process(database_url, admin_token, max_streams_per_tenant=2) as coordinator,
            AsyncClient(coordinator.target, admin_token, retry=RetryPolicy(attempts=1)) as admin,
            AsyncClient(coordinator.target, acme_token, retry=RetryPolicy(attempts=1)) as acme,
            AsyncClient(coordinator.target, other_token, retry=RetryPolicy(attempts=1)) as other,
        ):
            answered = await admin.set_tenant_limits(TenantLimits(max_watch_streams=3), "other")
            assert answered.max_watch_streams == 3
            assert (await admin.tenant_limits("acme")).max_watch_streams == 2  # the default
            later = await acme.submit("test.work", {}, delay=3600)
            other_later = await other.submit("test.work", {}, delay=3600)
            channel = grpc.aio.insecure_channel(coordinator.target)
            stub = jobs_pb2_grpc.JobServiceStub(channel)

            def watch(token: str, job_id: str) -> grpc.aio.UnaryStreamCall:  # type: ignore[type-arg]
                md = (("authorization", f"Bearer {token}"),)
                call: grpc.aio.UnaryStreamCall = stub.WatchJob(  # type: ignore[type-arg]
                    jobs_pb2.WatchJobRequest(job_id=job_id), metadata=md
                )
                return call

            async def refused(call: grpc.aio.UnaryStreamCall) -> str:  # type: ignore[type-arg]
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call.read()
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                return info.value.details() or ""

            open_calls = [watch(acme_token, later.job_id) for _ in range(2)]
            for call in open_calls:
                assert (await call.read()).job_id == later.job_id  # open and streaming
            assert "2 streams open" in await refused(watch(acme_token, later.job_id))
            # Another tenant is not held to acme's count, and has its own cap.
            theirs = [watch(other_token, other_later.job_id) for _ in range(3)]
            for call in theirs:
                assert (await call.read()).job_id == other_later.job_id
            assert "3 streams open" in await refused(watch(other_token, other_later.job_id))
            # A closed stream gives its place back.
            open_calls[0].cancel()
            retry = watch(acme_token, later.job_id)
            for _ in range(50):
                try:
                    assert (await retry.read()).job_id == later.job_id
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    await asyncio.sleep(0.1)  # the server has not seen the cancel yet
                    retry = watch(acme_token, later.job_id)
            else:
                raise AssertionError("the cancelled stream's place was never given back")
            for call in (*open_calls, *theirs, retry):
                call.cancel()
            await channel.close()
