"""A TCP proxy whose connections a fault injector can cut: what a process sees when its
Postgres (or a replica's primary) goes away (``shardq soak``, the chaos tests), without
stopping a server others share."""

from __future__ import annotations

import asyncio
import contextlib
import socket


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
        #: Bumped by each cut: a connection accepted before it whose upstream connected after
        #: it is dropped, not forwarded.
        self._cuts = 0
        #: The socket ``restore()`` listens on until its server task takes it.
        self._pending: socket.socket | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, sock=self._listen())
        return self.port

    def _listen(self) -> socket.socket:
        """The listening socket, bound here (not in start_server) so that ``restore()``, a
        plain function, listens again at once: connections made before the server task runs
        wait in the backlog instead of being refused."""
        sock = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR: the same port
        self.port = sock.getsockname()[1]
        return sock

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off or self.refusing:
            writer.transport.abort()
            return
        cuts = self._cuts
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        if self._cuts != cuts or self.cut_off:  # cut while the upstream was connecting
            writer.transport.abort()
            up_writer.transport.abort()
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
        """Drop every connection and stop listening: a new connection is refused (as by a
        host that is down), not accepted and then closed, which a client would take for a
        server that answered."""
        self.cut_off = True
        self._cuts += 1
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._pending is not None:
            self._pending.close()
            self._pending = None
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    def refuse_new(self) -> None:
        self.refusing = True

    def restore(self) -> None:
        """Forward again, on the same port."""
        self.cut_off = self.refusing = False
        if self._server is None and self._pending is None and self.port:
            sock = self._pending = self._listen()
            task = asyncio.get_running_loop().create_task(self._serve(sock))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _serve(self, sock: socket.socket) -> None:
        if self._pending is not sock:  # cut (or stopped) again meanwhile: it closed it
            return
        self._pending = None
        cuts = self._cuts
        server = await asyncio.start_server(self._accept, sock=sock)
        if self._cuts != cuts:  # cut while it started: it must not listen
            server.close()
            return
        self._server = server

    async def stop(self) -> None:
        server = self._server
        self.cut()
        for t in list(self._pipes):
            t.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
