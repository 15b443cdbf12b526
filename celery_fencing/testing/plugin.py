"""The pytest plugin: the kit as fixtures, every one named ``fencing_*``.

Loaded by the ``pytest11`` entry point ``celery_fencing.testing`` (the package,
which names this module in its ``pytest_plugins``) or with
``pytest -p celery_fencing.testing``. The names keep clear of
``celery.contrib.pytest`` (``celery_app``, ``celery_worker``, ``celery_config``,
...) and of pytest-celery (``celery_setup``, ``celery_worker``,
``default_*``, ``celery_*_cluster``, ...), so a test can use all three.

Fixtures only: nothing is autouse, and nothing starts until a test asks for
it. No driver is imported when the plugin loads.

=============================  ===========================================================
fixture                        gives
=============================  ===========================================================
``fencing_zookeeper``          a throwaway standalone ZooKeeper (one JVM per session,
                               serving when each test starts)
``fencing_zookeeper_ensemble`` a throwaway 3-node ensemble, likewise
``fencing_pause_points``       :class:`PausePoints` for this test, active in this process;
                               everything is released after the test
``fencing_events``             :class:`FencingEvents`, recording this process's signals
``fencing_workers``            :class:`FencedWorkers`: start real workers of your app,
                               wired to the two above; all stopped after the test
``fencing_tcp_proxy``          a factory of :class:`TcpProxy` to a ``host:port``, closed after
``fencing_sqlite_source``      a ``sqlite://`` token source URL in this test's directory
=============================  ===========================================================
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .events import FencingEvents, record_events
from .pause import PausePoints
from .redelivery import TcpProxy
from .workers import FencedWorker
from .zookeeper import ZooKeeperServer
from .zookeeper_ensemble import ZooKeeperEnsemble

__all__ = [
    "FencedWorkers",
    "fencing_events",
    "fencing_pause_points",
    "fencing_sqlite_source",
    "fencing_tcp_proxy",
    "fencing_workers",
    "fencing_zookeeper",
    "fencing_zookeeper_ensemble",
]


class FencedWorkers:
    """Starts :class:`FencedWorker` processes for one test, with its pause points and events; stops them all."""

    def __init__(self, log_dir: Path, pause_points: PausePoints, events: FencingEvents) -> None:
        self.log_dir = log_dir
        self.pause_points = pause_points
        self.events = events
        self.started: list[FencedWorker] = []

    def start(self, app: str, *, name: str | None = None, timeout: float = 60.0, **options: Any) -> FencedWorker:
        """Start a worker of *app* (as ``celery -A`` takes it) and wait until it is ready.

        *options* are :class:`FencedWorker`'s (``queue``, ``source``, ``fencing``,
        ``settings``, ``pool``, ...); the name defaults to ``w1``, ``w2``, ...
        """
        worker = FencedWorker(
            app,
            name=name or f"w{len(self.started) + 1}",
            log_dir=self.log_dir,
            pause_points=self.pause_points,
            events=self.events,
            **options,
        )
        self.started.append(worker)
        return worker.start(timeout)

    def stop_all(self) -> None:
        for worker in self.started:
            worker.stop()


@pytest.fixture(scope="session")
def _fencing_zookeeper_session() -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer() as server:
        yield server


@pytest.fixture
def fencing_zookeeper(_fencing_zookeeper_session: ZooKeeperServer) -> ZooKeeperServer:
    """A standalone throwaway ZooKeeper, serving when the test starts; the test may stop, pause or restart it.

    One JVM serves the whole session; keep tests apart with a root znode of
    their own (``server.url("/my-test")``).
    """
    _fencing_zookeeper_session.ensure_serving()
    return _fencing_zookeeper_session


@pytest.fixture(scope="session")
def _fencing_zookeeper_ensemble_session() -> Iterator[ZooKeeperEnsemble]:
    with ZooKeeperEnsemble() as ensemble:
        yield ensemble


@pytest.fixture
def fencing_zookeeper_ensemble(_fencing_zookeeper_ensemble_session: ZooKeeperEnsemble) -> ZooKeeperEnsemble:
    """A 3-node throwaway ZooKeeper ensemble, every node serving with one leader when the test starts."""
    _fencing_zookeeper_ensemble_session.ensure_serving()
    return _fencing_zookeeper_ensemble_session


@pytest.fixture
def fencing_pause_points(tmp_path: Path) -> Iterator[PausePoints]:
    """This test's pause points, active in the test process; every held execution is released after the test."""
    points = PausePoints(tmp_path / "fencing-pause-points")
    points.activate()
    yield points
    points.close()


@pytest.fixture
def fencing_events(tmp_path: Path) -> Iterator[FencingEvents]:
    """This test's record of fencing signals: the test process's own, and its workers' (through ``fencing_workers``)."""
    events = FencingEvents(tmp_path / "fencing-events.jsonl")
    disconnect = record_events(events.path)
    yield events
    disconnect()


@pytest.fixture
def fencing_workers(
    tmp_path: Path, fencing_pause_points: PausePoints, fencing_events: FencingEvents
) -> Iterator[FencedWorkers]:
    """Start real workers of your app: ``fencing_workers.start("proj.celery", source=..., queue=...)``."""
    workers = FencedWorkers(tmp_path / "fencing-workers", fencing_pause_points, fencing_events)
    yield workers
    workers.stop_all()


@pytest.fixture
def fencing_tcp_proxy() -> Iterator[Any]:
    """A factory: ``fencing_tcp_proxy("127.0.0.1", 5672)`` is a started :class:`TcpProxy`, closed after the test."""
    proxies: list[TcpProxy] = []

    def make(host: str, port: int) -> TcpProxy:
        proxy = TcpProxy(host, port).start()
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def fencing_sqlite_source(tmp_path: Path) -> str:
    """A durable ``sqlite://`` token source URL in this test's own directory."""
    return f"sqlite:///{tmp_path / 'fencing-tokens.db'}"
