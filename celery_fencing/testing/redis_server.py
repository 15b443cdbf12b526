"""A throwaway ``redis-server`` for tests: a free loopback port, a directory of its own, nothing kept unless asked.

Like the kit's ZooKeeper nodes it is a :class:`~.servers.ServerProcess`: it
runs under the parent-death signal, is signalled only by the pid it started,
and a test may stop, kill (a crash), pause and resume it. Start it again with
:meth:`RedisServer.start`: it keeps its port, so clients reconnect.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from .processes import HOST, free_ports
from .servers import START_TIMEOUT, ServerProcess

__all__ = ["REDIS_SERVER", "RedisServer"]

_R = TypeVar("_R", bound="RedisServer")

#: The ``redis-server`` binary (``FENCING_TEST_REDIS_SERVER`` overrides it).
REDIS_SERVER = os.environ.get("FENCING_TEST_REDIS_SERVER") or shutil.which("redis-server") or "redis-server"


class RedisServer(ServerProcess):
    """A ``redis-server`` on a free loopback port, serving once it answers ``PING``.

    It keeps nothing on disk (``--save ""``, ``--appendonly no``), so a
    restart forgets every key, unless *options* say otherwise.

    :param directory: its ``--dir`` and its log (default: a new temporary directory, removed by :meth:`close`).
    :param options: more ``redis-server`` arguments, after the defaults, which they override
        (``["--appendonly", "yes"]``).
    """

    def __init__(self, directory: Path | None = None, *, options: Sequence[str] = ()) -> None:
        self._owns_dir = directory is None
        directory = Path(tempfile.mkdtemp(prefix="redis-")) if directory is None else Path(directory)
        super().__init__(directory, directory / "redis.log")
        self.port = free_ports(1)[0]
        self.options = list(options)

    def describe(self) -> str:
        return f"redis-server on port {self.port}"

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def command(self) -> list[str]:
        """The command line :meth:`launch` runs (a subclass may start it from a configuration file instead)."""
        defaults = ["--bind", HOST, "--port", str(self.port), "--dir", str(self.directory)]
        return [REDIS_SERVER, *defaults, "--save", "", "--appendonly", "no", *self.options]

    def launch(self) -> None:
        self._spawn(self.command())

    def serving(self) -> bool:
        """Whether it answers ``PING`` on its port."""
        with contextlib.suppress(OSError), socket.create_connection((HOST, self.port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
        return False

    def wait_serving(self, timeout: float = START_TIMEOUT) -> None:
        self._wait_until(self.serving, timeout)

    def start(self: _R, timeout: float = START_TIMEOUT) -> _R:
        """Start it (again, on the same port) and wait until it serves; return self."""
        self.launch()
        self.wait_serving(timeout)
        return self

    def close(self) -> None:
        """Stop it and remove its directory (if this object created it)."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self: _R) -> _R:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
