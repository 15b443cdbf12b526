"""A small asyncio TCP proxy on loopback, for cutting one worker off from ZooKeeper.

The worker's kazoo client is given only the proxies' addresses, so what the
proxy does is all it sees. Modes, switched at any time:

``pass``       forward both ways
``blackhole``  forward nothing in either direction and open no new upstream
               connection, but close nothing either (a partition: nobody is
               told; the kernel buffers fill and the peers' timeouts fire)
``reset``      abort every connection with a TCP RST (SO_LINGER 0), and reset
               new ones at once (a crashed peer or a firewall reject)
``delay``      forward, each chunk held for ``delay`` seconds first (a slow link)

Data is never dropped from the middle of a stream (TCP would retransmit it):
in ``blackhole`` the proxy stops reading, and what is buffered flows when the
mode changes back, by which time the peers have usually given the connection
up. Each proxy counts what it forwarded, delayed, held and reset, so a fault
can be proven from the proxy's own figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass, field

__all__ = ["MODES", "ProxyStats", "TcpProxy"]

MODES = ("pass", "blackhole", "reset", "delay")
_CHUNK = 65536


@dataclass
class ProxyStats:
    connections: int = 0
    forwarded: int = 0
    held: int = 0
    delayed: int = 0
    resets: int = 0
    modes: list[str] = field(default_factory=list)


class TcpProxy:
    """Forwards ``listen_host:listen_port`` to ``upstream``; one instance per upstream address.

    Runs on the event loop that calls :meth:`start`; mode changes must come
    from that loop (or through ``loop.call_soon_threadsafe``).
    """

    def __init__(self, upstream: tuple[str, int], *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.upstream = upstream
        self.host = host
        self.port = port
        self.mode = "pass"
        self.delay = 0.0
        self.stats = ProxyStats()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def set_mode(self, mode: str, delay: float = 0.0) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown proxy mode {mode!r}; expected one of {MODES}")
        self.mode = mode
        self.delay = delay
        self.stats.modes.append(mode)
        if mode == "blackhole":
            self._flowing.clear()
            self.stats.held += len(self._pairs)
        else:
            self._flowing.set()
        if mode == "reset":
            for client, upstream in list(self._pairs):
                self._reset(client)
                self._reset(upstream)
            self._pairs.clear()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        for client, upstream in list(self._pairs):
            client.close()
            upstream.close()
        self._pairs.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # Internals ----------------------------------------------------------------------

    def _reset(self, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.stats.resets += 1
        writer.transport.abort()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        if not self._flowing.is_set():
            self.stats.held += 1
            await self._flowing.wait()  # a partition: the connection attempt goes nowhere
        if self.mode == "reset":
            self._reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream), 5)
        except (OSError, asyncio.TimeoutError):
            self._reset(writer)  # upstream down: the client sees a refused connection
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        tasks = [
            asyncio.ensure_future(self._pump(reader, up_writer, pair)),
            asyncio.ensure_future(self._pump(up_reader, writer, pair)),
        ]
        for task in tasks:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            while True:
                await self._flowing.wait()
                data = await reader.read(_CHUNK)
                if not data:
                    break
                await self._flowing.wait()  # data read just before a partition waits it out
                if self.mode == "reset" or pair not in self._pairs:
                    break
                if self.mode == "delay" and self.delay > 0:
                    self.stats.delayed += len(data)
                    await asyncio.sleep(self.delay)  # the fault itself: a slow link
                writer.write(data)
                await writer.drain()
                self.stats.forwarded += len(data)
        except (ConnectionError, OSError):
            pass
        finally:
            if pair in self._pairs:
                self._pairs.discard(pair)
                for side in pair:
                    side.close()
