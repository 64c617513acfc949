"""A TCP proxy whose connections a fault injector can cut: what a process sees when its
Postgres goes away (``shardq soak``, the chaos tests), without stopping a server others share."""

from __future__ import annotations

import asyncio
import contextlib


class CuttableProxy:
    """Forwards 127.0.0.1:port to a target; ``cut()`` drops every connection and refuses new
    ones until ``restore()`` — what a worker sees when its database goes away. ``refuse_new()``
    refuses new ones only, the open ones go on: a server at its connection limit."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.cut_off = False
        self.refusing = False
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off or self.refusing:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        dst.close()
        self._writers.discard(dst)

    def cut(self) -> None:
        self.cut_off = True
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    def refuse_new(self) -> None:
        self.refusing = True

    def restore(self) -> None:
        self.cut_off = self.refusing = False

    async def stop(self) -> None:
        self.cut()
        for t in list(self._pipes):
            t.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
