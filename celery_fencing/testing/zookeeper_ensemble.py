"""A throwaway ZooKeeper ensemble on loopback, and expiring a client's session the standard way."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from .processes import HOST, free_ports
from .zookeeper import START_TIMEOUT, ZooKeeperError, ZooKeeperNode, _base_config, _bind_failed, _Owner

__all__ = ["ZooKeeperEnsemble", "expire_session"]


class ZooKeeperEnsemble(_Owner):
    """A throwaway ZooKeeper ensemble of *size* (odd) nodes on loopback.

    Elections are quick (tickTime 500 ms, small init/sync limits): a killed
    leader is replaced in about a second.
    """

    def __init__(
        self,
        size: int = 3,
        directory: Path | None = None,
        *,
        tick_time: int = 500,
        force_sync: bool = False,
        heap: str = "128m",
    ) -> None:
        if size < 3 or size % 2 == 0:
            raise ValueError("an ensemble needs an odd number of nodes, at least 3")
        super().__init__(directory, "zk-ensemble-")
        self.size = size
        self.tick_time = tick_time
        self.force_sync = force_sync
        self.heap = heap
        self.nodes = self._make_nodes()

    def _make_nodes(self) -> list[ZooKeeperNode]:
        ports = free_ports(3 * self.size)
        client, quorum, election = ports[: self.size], ports[self.size : 2 * self.size], ports[2 * self.size :]
        servers = [f"server.{i + 1}={HOST}:{quorum[i]}:{election[i]}" for i in range(self.size)]
        nodes = []
        for i in range(self.size):
            directory = self.directory / f"node{i + 1}"
            config = _base_config(directory / "data", client[i], tick_time=self.tick_time, force_sync=self.force_sync)
            config += [
                "initLimit=10",
                "syncLimit=4",
                # Election connections to a dead peer fail fast instead of waiting 5 s.
                "cnxTimeout=1000",
                "electionPortBindRetry=3",
                "quorumListenOnAllIPs=false",
                *servers,
            ]
            nodes.append(ZooKeeperNode(directory, client[i], "\n".join(config) + "\n", server_id=i + 1, heap=self.heap))
        return nodes

    @property
    def hosts(self) -> str:
        """Every node's ``host:port``, comma-separated: a client fails over between them."""
        return ",".join(node.hosts for node in self.nodes)

    def url(self, root: str = "/fencing", **params: object) -> str:
        query = "&".join(f"{key}={value}" for key, value in params.items())
        return f"zookeeper://{self.hosts}{root}" + (f"?{query}" if query else "")

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start every node and wait until they all serve with one leader."""
        first_start = not (self.nodes[0].data_dir / "version-2").exists()
        for attempt in range(3):
            for node in self.nodes:
                node.launch()
            try:
                self.wait_healthy(timeout)
                return
            except ZooKeeperError:
                bind_failed = any(_bind_failed(node) for node in self.nodes)
                for node in self.nodes:
                    node.kill()
                if not (first_start and bind_failed) or attempt == 2:
                    raise
                for node in self.nodes:
                    shutil.rmtree(node.directory, ignore_errors=True)
                self.nodes = self._make_nodes()

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> ZooKeeperNode:
        """Wait until every node serves and exactly one leads; return the leader."""
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            node.wait_serving(max(0.1, deadline - time.monotonic()))
        return self.leader(timeout=max(0.1, deadline - time.monotonic()))

    def leader(self, *, timeout: float = START_TIMEOUT, exclude: ZooKeeperNode | None = None) -> ZooKeeperNode:
        """Return the node whose ``srvr`` says ``Mode: leader``, polling until one does.

        *exclude* skips a node (e.g. the leader just killed, which may still be
        reported while it dies).
        """
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            leaders = [node for node in self.nodes if node is not exclude and node.mode() == "leader"]
            if len(leaders) == 1:
                return leaders[0]
            if time.monotonic() >= deadline:
                modes = {node.client_port: node.mode() for node in self.nodes}
                raise ZooKeeperError(f"no single ZooKeeper leader within {timeout}s: {modes}")
            time.sleep(delay)  # polling interval; the loop re-checks
            delay = min(delay * 1.5, 0.25)

    def kill_leader(self, *, timeout: float = START_TIMEOUT) -> ZooKeeperNode:
        """SIGKILL the current leader and wait until the others elect a new one; return the killed node."""
        old = self.leader(timeout=timeout)
        old.kill()
        self.leader(timeout=timeout, exclude=old)
        return old

    def ensure_serving(self, timeout: float = START_TIMEOUT) -> None:
        """Resume paused nodes, start stopped ones, and wait for a healthy ensemble."""
        for node in self.nodes:
            if node.paused:
                node.resume()
        for node in self.nodes:
            if not node.running:
                node.launch()
        self.wait_healthy(timeout)

    def close(self) -> None:
        for node in self.nodes:
            node.stop()
        self._remove_dir()

    def __enter__(self) -> ZooKeeperEnsemble:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ZooKeeperEnsemble {self.nodes!r}>"


def expire_session(client: Any, hosts: str, *, timeout: float = 30.0) -> None:
    """Expire a started KazooClient's session, the standard way, and wait until it reports LOST.

    A second client connects with the same session id and password (ZooKeeper
    moves the session to it, dropping the first client's connection) and closes
    it. If the first client reconnects before the close lands, the session moves
    back and survives: then the trick is repeated until LOST is seen.
    """
    from kazoo.client import KazooClient
    from kazoo.protocol.states import KazooState

    lost = threading.Event()

    def listener(state: str) -> bool:
        if state == KazooState.LOST:
            lost.set()
            return True  # kazoo removes a listener that returns True
        return False

    session_id, password = client.client_id
    client.add_listener(listener)
    deadline = time.monotonic() + timeout
    try:
        while not lost.is_set():
            if time.monotonic() > deadline:
                raise ZooKeeperError(f"session {session_id:#x} did not expire within {timeout}s")
            thief = KazooClient(hosts, client_id=(session_id, password))
            try:
                thief.start(max(1.0, deadline - time.monotonic()))
                thief.stop()
            finally:
                thief.close()
            lost.wait(min(3.0, max(0.0, deadline - time.monotonic())))
    finally:
        client.remove_listener(listener)


# pytest fixtures ---------------------------------------------------------------------
