"""Throwaway ZooKeeper servers for tests: one JVM per node, on free loopback ports, in a temporary directory.

Debian's ``zookeeper`` package (``/usr/share/java/zookeeper.jar``) is the server;
nothing here looks at, stops or reconfigures a ZooKeeper the machine already
runs, and servers are only ever signalled by the pid this module started.
Every JVM is registered with :mod:`celery_fencing.testing.processes`, so none
outlives the test run. A standalone server is :class:`ZooKeeperServer`; an
ensemble is :class:`~celery_fencing.testing.zookeeper_ensemble.ZooKeeperEnsemble`.

A test may stop, kill -9, SIGSTOP (:meth:`ZooKeeperServer.pause`) or restart
a server; :meth:`ZooKeeperServer.ensure_serving` repairs it for the next test.

Environment: ``FENCING_TEST_ZOOKEEPER_CLASSPATH`` (default: Debian's
``/usr/share/java/zookeeper.jar`` and ``slf4j-simple.jar``) and
``FENCING_TEST_JAVA`` (default: ``java`` on the PATH).
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

from .processes import HOST, free_ports
from .servers import START_TIMEOUT, ServerGroup, ServerProcess, source_url

__all__ = [
    "CLASSPATH",
    "START_TIMEOUT",
    "ZooKeeperError",
    "ZooKeeperNode",
    "ZooKeeperServer",
    "four_letter_word",
]

CLASSPATH = os.environ.get(
    "FENCING_TEST_ZOOKEEPER_CLASSPATH", "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar"
)
JAVA = os.environ.get("FENCING_TEST_JAVA") or shutil.which("java") or "java"


class ZooKeeperError(RuntimeError):
    """A throwaway server failed to start, stop or elect a leader in time.

    A test failure, not a library error: it derives from RuntimeError, not
    :class:`~celery_fencing.FencingError`, so code that handles fencing errors never swallows it.
    """


def four_letter_word(port: int, command: str = "srvr", *, host: str = HOST, timeout: float = 2.0) -> str:
    """Send a ZooKeeper four-letter command and return the reply ('' when nothing answers)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(command.encode("ascii"))
            chunks = []
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return ""


class ZooKeeperNode(ServerProcess):
    """One ZooKeeper JVM: its directory, ports and process.

    :param directory: holds ``conf/zoo.cfg``, ``data/`` and ``zookeeper.log``.
    :param client_port: the port clients connect to on 127.0.0.1.
    :param config: the full ``zoo.cfg`` text.
    :param server_id: the ``myid`` of a quorum member, ``None`` for standalone.
    :param classpath: the JVM's class path (default: :data:`CLASSPATH`, read at each launch).
    """

    error = ZooKeeperError

    def __init__(
        self,
        directory: Path,
        client_port: int,
        config: str,
        *,
        server_id: int | None = None,
        heap: str = "128m",
        classpath: str | None = None,
    ) -> None:
        super().__init__(directory, directory / "zookeeper.log")
        self.classpath = classpath
        self.client_port = client_port
        self.server_id = server_id
        self.heap = heap
        self.conf_dir = directory / "conf"
        self.data_dir = directory / "data"
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.conf_dir / "zoo.cfg").write_text(config)
        if server_id is not None:
            (self.data_dir / "myid").write_text(f"{server_id}\n")

    def describe(self) -> str:
        return f"ZooKeeper on port {self.client_port}"

    # Introspection ------------------------------------------------------------

    @property
    def hosts(self) -> str:
        """The ``host:port`` a client connects to."""
        return f"{HOST}:{self.client_port}"

    def mode(self, timeout: float = 2.0) -> str | None:
        """Return 'standalone', 'leader' or 'follower' while serving, else ``None``."""
        if not self.running or self.paused:
            return None
        for line in four_letter_word(self.client_port, "srvr", timeout=timeout).splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def serving(self) -> bool:
        return self.mode() is not None

    # Lifecycle ----------------------------------------------------------------

    def launch(self) -> None:
        """Start the JVM without waiting for it to serve (see :meth:`wait_serving`)."""
        self._spawn(
            [
                JAVA,
                f"-Xmx{self.heap}",
                "-Xss512k",
                # Fewer JIT and GC threads: the machine has 2 cores shared with other suites.
                "-XX:+UseSerialGC",
                "-XX:CICompilerCount=2",
                "-Dzookeeper.admin.enableServer=false",
                "-Dzookeeper.jmx.log4j.disable=true",
                # A restart right after the first writes may find a log but no snapshot yet.
                "-Dzookeeper.snapshot.trust.empty=true",
                "-cp",
                f"{self.conf_dir}:{self.classpath or CLASSPATH}",
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                str(self.conf_dir / "zoo.cfg"),
            ]
        )

    def wait_serving(self, timeout: float = START_TIMEOUT) -> None:
        """Poll ``srvr`` until the node serves requests, or raise :class:`ZooKeeperError`."""
        self._wait_until(self.serving, timeout)

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the JVM and wait until it serves (a quorum member needs a quorum for that)."""
        self.launch()
        self.wait_serving(timeout)

    def restart(self, timeout: float = START_TIMEOUT) -> None:
        """Stop and start again with the same ports and data directory."""
        self.stop()
        self.start(timeout)

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"<ZooKeeperNode id={self.server_id} port={self.client_port} {state}>"


def _base_config(data_dir: Path, client_port: int, *, tick_time: int, force_sync: bool) -> list[str]:
    return [
        f"tickTime={tick_time}",
        f"dataDir={data_dir}",
        f"clientPort={client_port}",
        f"clientPortAddress={HOST}",
        # Session timeouts from 2 to 40 ticks (1 s to 20 s with tickTime=500).
        f"minSessionTimeout={2 * tick_time}",
        f"maxSessionTimeout={40 * tick_time}",
        "maxClientCnxns=0",
        "admin.enableServer=false",
        "4lw.commands.whitelist=*",
        # fsync on each commit is real I/O on this disk; tests do not survive power loss
        # anyway. The benchmark keeps it on, to compare fairly with SQLite's FULL sync.
        f"forceSync={'yes' if force_sync else 'no'}",
        "autopurge.purgeInterval=0",
    ]


class ZooKeeperServer(ServerGroup[ZooKeeperNode]):
    """A standalone throwaway ZooKeeper server.

    ::

        with ZooKeeperServer() as server:
            client = KazooClient(server.hosts)
            server.restart()      # same port, same data

    :param directory: where to keep config, data and log (default: a new temp dir,
        removed by :meth:`close`).
    :param tick_time: ZooKeeper's tick in ms; sessions may last 2 to 40 ticks.
    :param force_sync: fsync the transaction log on every commit (ZooKeeper's default).
    """

    error = ZooKeeperError

    def __init__(
        self,
        directory: Path | None = None,
        *,
        tick_time: int = 500,
        force_sync: bool = False,
        heap: str = "128m",
    ) -> None:
        super().__init__(directory, "zk-standalone-")
        self.tick_time = tick_time
        self.force_sync = force_sync
        self.heap = heap
        self.members = self._make_members()

    def _make_members(self) -> list[ZooKeeperNode]:
        return [self._make_node(free_ports(1)[0])]

    def _make_node(self, port: int) -> ZooKeeperNode:
        directory = self.directory / "node"
        config = _base_config(directory / "data", port, tick_time=self.tick_time, force_sync=self.force_sync)
        return ZooKeeperNode(directory, port, "\n".join(config) + "\n", heap=self.heap)

    def _leads(self, member: ZooKeeperNode) -> bool:
        return member.serving()

    def _fresh(self) -> bool:
        return not (self.node.data_dir / "version-2").exists()

    @property
    def node(self) -> ZooKeeperNode:
        return self.members[0]

    @property
    def hosts(self) -> str:
        return self.node.hosts

    @property
    def port(self) -> int:
        return self.node.client_port

    def url(self, root: str = "/fencing", **params: object) -> str:
        """A ``zookeeper://`` URL for this server (query parameters from *params*)."""
        return source_url("zookeeper", self.hosts, root, params)

    def stop(self) -> None:
        self.node.stop()

    def kill(self) -> None:
        self.node.kill()

    def pause(self) -> None:
        self.node.pause()

    def resume(self) -> None:
        self.node.resume()

    @property
    def running(self) -> bool:
        return self.node.running

    def __repr__(self) -> str:
        return f"<ZooKeeperServer {self.hosts} {self.node!r}>"
