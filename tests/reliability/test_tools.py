"""The suite's own tools on real sockets and files: the TCP proxy's modes and the JSONL history."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from reliability.history import HistoryTail, HistoryWriter, read_history
from reliability.proxy import TcpProxy


async def _echo_server() -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(echo, "127.0.0.1", 0)


@contextlib.asynccontextmanager
async def _proxied_echo() -> AsyncIterator[TcpProxy]:
    """A TcpProxy (in pass mode) in front of a local echo server; both closed on exit."""
    server = await _echo_server()
    proxy = await TcpProxy(server.sockets[0].getsockname()[:2]).start()
    try:
        yield proxy
    finally:
        await proxy.close()
        server.close()


async def _roundtrip(port: int, payload: bytes, timeout: float) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), timeout)
    finally:
        writer.close()


async def _open_echoing(port: int, payload: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to *port* that has echoed *payload* once (so it is open end to end), left open."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    assert await asyncio.wait_for(reader.readexactly(len(payload)), 5) == payload
    return reader, writer


def test_proxy_pass_and_delay() -> None:
    """In pass mode bytes go through; in delay mode each chunk arrives no sooner than the delay."""

    async def scenario() -> float:
        async with _proxied_echo() as proxy:
            assert await _roundtrip(proxy.port, b"hello", 5) == b"hello"
            proxy.set_mode("delay", 0.3)
            began = time.monotonic()
            assert await _roundtrip(proxy.port, b"slow", 5) == b"slow"
            return time.monotonic() - began

    elapsed = asyncio.run(scenario())
    assert elapsed >= 0.6, "two hops (there and back) of 0.3 s each"


def test_proxy_blackhole_holds_and_pass_releases() -> None:
    """A blackhole forwards nothing (no reply, no error) and drops nothing: pass again delivers what was held."""

    async def scenario() -> None:
        async with _proxied_echo() as proxy:
            reader, writer = await _open_echoing(proxy.port, b"one")
            proxy.set_mode("blackhole")
            writer.write(b"two")
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(reader.readexactly(3), 0.5)
            proxy.set_mode("pass")
            assert await asyncio.wait_for(reader.readexactly(3), 5) == b"two"
            assert proxy.stats.held >= 1
            writer.close()

    asyncio.run(scenario())


def test_proxy_reset_aborts_connections() -> None:
    """Reset mode aborts open connections with an RST and resets new ones at once."""

    async def scenario() -> None:
        async with _proxied_echo() as proxy:
            reader, _ = await _open_echoing(proxy.port, b"x")
            proxy.set_mode("reset")
            with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
                await asyncio.wait_for(reader.readexactly(1), 5)
            with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError, BrokenPipeError)):
                await _roundtrip(proxy.port, b"y", 5)
            assert proxy.stats.resets >= 2

    asyncio.run(scenario())


def test_history_survives_a_cut_line_and_is_tailed(tmp_path: Path) -> None:
    """Lines are read in time order across files; a line cut short by SIGKILL is skipped; a tail sees only new lines."""
    writer = HistoryWriter(tmp_path, "w1", mode="fenced")
    tail = HistoryTail(tmp_path)
    writer.emit("minted", task="a", token=1)
    assert [e["ev"] for e in tail.poll()] == ["minted"]
    writer.emit("ok", task="a", token=1)
    with (tmp_path / f"w1-{os.getpid()}.jsonl").open("ab") as handle:
        handle.write(b'{"ev":"invoke","t":')  # a process killed mid-line
    assert [e["ev"] for e in tail.poll()] == ["ok"]
    other = HistoryWriter(tmp_path, "w2", mode="control")
    other.emit("submit", task="b")
    events = read_history(tmp_path)
    assert [e["ev"] for e in events] == ["minted", "ok", "submit"]
    assert events[0]["mode"] == "fenced" and events[0]["worker"] == "w1" and events[0]["pid"] == os.getpid()
