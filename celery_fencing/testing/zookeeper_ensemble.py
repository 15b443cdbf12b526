"""A throwaway ZooKeeper ensemble on loopback, and expiring a client's session the standard way."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from .processes import HOST, free_ports
from .servers import ServerGroup, source_url
from .zookeeper import ZooKeeperError, ZooKeeperNode, _base_config

__all__ = ["ZooKeeperEnsemble", "expire_session"]


class ZooKeeperEnsemble(ServerGroup[ZooKeeperNode]):
    """A throwaway ZooKeeper ensemble of *size* (odd) nodes on loopback.

    Elections are quick (tickTime 500 ms, small init/sync limits): a killed
    leader is replaced in about a second.
    """

    error = ZooKeeperError

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
        self.members = self._make_members()

    def _make_members(self) -> list[ZooKeeperNode]:
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

    def _leads(self, member: ZooKeeperNode) -> bool:
        return member.mode() == "leader"

    def _fresh(self) -> bool:
        return not (self.nodes[0].data_dir / "version-2").exists()

    @property
    def nodes(self) -> list[ZooKeeperNode]:
        """The nodes, in ``myid`` order."""
        return self.members

    @property
    def hosts(self) -> str:
        """Every node's ``host:port``, comma-separated: a client fails over between them."""
        return ",".join(node.hosts for node in self.nodes)

    def url(self, root: str = "/fencing", **params: object) -> str:
        return source_url("zookeeper", self.hosts, root, params)


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
