"""What a unary call costs a bare ``grpc.aio`` server on this machine: the floor under
issue 19's "coordinator CPU per unary SubmitJob ≤ 250 µs".

    python bench/grpc_floor.py [--calls 6000] [--rounds 3] [--event-loops uvloop asyncio]
                               [--out FILE.json]

A server process with one method that returns the request's bytes (no protobuf, no
handler work), served as the coordinator serves its methods: unary, and request-streaming
with the handler reading the one message (as ``coordinator/gate.py`` does); each with no
interceptor and with two that pass every call through (the coordinator has two). One client
process sends 200-byte requests with a bearer-token header, ``--in-flight`` at a time; the
server's CPU time (``/proc``) over the calls / calls is the figure (median of ``--rounds``).
The coordinator's own figure is ``bench/op_costs.py``'s ``coordinator_unary_us``. The server
runs on the event loop the coordinator runs on (``shardq.common.loop``); ``--event-loops``
measures each shape on each loop named (``SHARDQ_EVENT_LOOP``), alternated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from shardq.common.loop import run_main

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from op_costs import _git, machine  # noqa: E402
from services import free_port  # noqa: E402

METHOD = "/floor.Echo/Echo"
REQUEST = b"x" * 200
METADATA = (("authorization", "Bearer floor-token"),)


class PassThrough(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        return await continuation(handler_call_details)


async def _serve(port: int, streaming: bool, interceptors: int, ready: Any) -> None:
    async def unary(request: bytes, _context: Any) -> bytes:
        return request

    async def read_one(_requests: Any, context: Any) -> Any:
        return await context.read()

    handler: Any = (
        grpc.stream_unary_rpc_method_handler(read_one)
        if streaming
        else grpc.unary_unary_rpc_method_handler(unary)
    )
    server = grpc.aio.server(interceptors=[PassThrough() for _ in range(interceptors)])
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("floor.Echo", {"Echo": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    ready.set()
    await server.wait_for_termination()


def _server_main(
    port: int, streaming: bool, interceptors: int, event_loop: str, ready: Any
) -> None:
    if event_loop:
        os.environ["SHARDQ_EVENT_LOOP"] = event_loop
    run_main(_serve(port, streaming, interceptors, ready))


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def _rounds(
    port: int, pid: int, calls: int, in_flight: int, rounds: int
) -> list[dict[str, float]]:
    out = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call: Any = channel.unary_unary(METHOD)
        await call(REQUEST)  # the connection is up before timing starts
        for _ in range(rounds):
            numbers = iter(range(calls))

            async def lane(numbers: Any = numbers) -> None:  # the round's one shared iterator
                for _ in numbers:
                    await call(REQUEST, metadata=METADATA)

            cpu0, t0 = _cpu_s(pid), time.perf_counter()
            await asyncio.gather(*(lane() for _ in range(in_flight)))
            wall, cpu = time.perf_counter() - t0, _cpu_s(pid) - cpu0
            out.append({"calls_per_s": calls / wall, "server_cpu_us_per_call": cpu * 1e6 / calls})
    return out


def measure(calls: int, in_flight: int, rounds: int, event_loops: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    ctx = multiprocessing.get_context("spawn")
    shapes = [(s, i, loop) for s in (False, True) for i in (0, 2) for loop in event_loops]
    for streaming, interceptors, loop in shapes:
        port, ready = free_port(), ctx.Event()
        server = ctx.Process(target=_server_main, args=(port, streaming, interceptors, loop, ready))
        server.start()
        try:
            if not ready.wait(30):
                raise RuntimeError("the grpc server did not start")
            assert server.pid is not None
            got = asyncio.run(_rounds(port, server.pid, calls, in_flight, rounds))
        finally:
            server.kill()
            server.join()
        name = f"{'request_streaming' if streaming else 'unary'}/{interceptors}_interceptors"
        name += f"/{loop}" if loop else ""
        results[name] = {
            "server_cpu_us_per_call": round(
                statistics.median(r["server_cpu_us_per_call"] for r in got), 1
            ),
            "calls_per_s": round(statistics.median(r["calls_per_s"] for r in got), 1),
            "rounds": [{k: round(v, 1) for k, v in r.items()} for r in got],
        }
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=6_000, help="calls per round")
    ap.add_argument("--in-flight", type=int, default=64, help="calls in flight")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per shape (median kept)")
    ap.add_argument(
        "--event-loops", nargs="+", default=[""], help="SHARDQ_EVENT_LOOP values (default: unset)"
    )
    ap.add_argument("--out", type=Path, default=None, help="JSON file to write")
    a = ap.parse_args()
    report: dict[str, Any] = {
        "schema": "shardq-grpc-floor/1",
        "command": " ".join(["python", "bench/grpc_floor.py", *sys.argv[1:]]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "HEAD"),
        "machine": machine(),
        "grpcio": grpc.__version__,
        "params": {
            "calls": a.calls,
            "in_flight": a.in_flight,
            "rounds": a.rounds,
            "event_loops": a.event_loops,
            "request_bytes": len(REQUEST),
        },
        "results": measure(a.calls, a.in_flight, a.rounds, a.event_loops),
    }
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    for name, r in report["results"].items():
        print(f"{name:34} {r['server_cpu_us_per_call']:7.1f} µs of server CPU per call  "
              f"{r['calls_per_s']:9,.0f} calls/s")  # fmt: skip


if __name__ == "__main__":
    main()
