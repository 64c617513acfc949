"""A tiny HTTP endpoint for operators: ``/metrics`` (Prometheus text), ``/healthz`` (JSON,
liveness) and, where the program defines readiness, ``/readyz`` (JSON).

Shared by the shard loop, the worker and the coordinator; asyncio-native so it needs no
thread and no web framework.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

HealthFn = Callable[[], tuple[bool, dict[str, Any]]]


class OpsServer:
    """Serves the registry at /metrics, ``health()`` at /healthz and ``ready()`` at /readyz
    (each 200 when it says yes, else 503; /readyz is 404 for a program without ``ready``).

    Both functions are called on the event loop for each request, so they must be cheap: the
    coordinator's ``ready`` returns what its background checker found last, and /healthz
    answering at all shows the loop is not stuck (liveness).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        health: HealthFn,
        host: str = "127.0.0.1",
        ready: HealthFn | None = None,
    ) -> None:
        self.registry = registry
        self.health = health
        self.ready = ready
        self.host = host
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self, port: int) -> int:
        self._server = await asyncio.start_server(self._handle, self.host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            path = request.split(b" ", 2)[1].split(b"?")[0] if b" " in request else b"/"
            if path == b"/metrics":
                status, ctype, body = 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
            elif path == b"/healthz" or (path == b"/readyz" and self.ready is not None):
                check = self.health if path == b"/healthz" else self.ready
                assert check is not None
                ok, detail = check()
                status, ctype = (200 if ok else 503), "application/json"
                body = json.dumps(detail).encode()
            else:
                status, ctype, body = 404, "text/plain", b"not found\n"
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (
            TimeoutError,
            asyncio.IncompleteReadError,
            ConnectionError,
            asyncio.LimitOverrunError,
        ):
            pass
        finally:
            writer.close()
