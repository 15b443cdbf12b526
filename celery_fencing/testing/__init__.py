"""celery-fencing's testing kit: prove in your own test suite that a stale write is refused and a task applied once.

* :func:`pause_point` in a task body; :class:`PausePoints` in the test holds an
  execution there, across processes, until the test releases it.
* :class:`FencedWorker`: a real ``celery worker`` process of your app, with its
  ``--fencing-*`` flags; freeze and thaw it as a whole.
* :class:`ZooKeeperServer`, :class:`ZooKeeperEnsemble`: throwaway ZooKeeper on
  free loopback ports (Debian's ``zookeeper`` package, or any ZooKeeper jar).
* :func:`redis_redelivery_settings` and :class:`TcpProxy`: re-delivery on the
  Redis broker (a short visibility timeout) and on RabbitMQ (a connection cut).
* :class:`FencingEvents`, :func:`assert_fenced_out`, :func:`assert_applied_once`:
  what the library's signals said, in every worker process.
* A pytest plugin (:mod:`celery_fencing.testing.plugin`, fixtures ``fencing_*``),
  loaded by its entry point or with ``pytest -p celery_fencing.testing``.

Importing this package is cheap enough for production code that calls
:func:`pause_point`: it loads the pause module only (the standard library),
and every other name on first use. See docs/testing.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _lazy
from .pause import Arrival, PausePoints, PausePointTimeoutError, pause_point

if TYPE_CHECKING:
    from .assertions import assert_applied_once, assert_fenced_out
    from .events import FencingEvent, FencingEvents, record_events
    from .plugin import FencedWorkers
    from .processes import free_ports, wait_for
    from .redelivery import TcpProxy, redis_redelivery_settings
    from .workers import FencedWorker, fencing_flags
    from .zookeeper import ZooKeeperError, ZooKeeperNode, ZooKeeperServer
    from .zookeeper_ensemble import ZooKeeperEnsemble, expire_session

# pytest registers this package as a plugin (entry point or -p) and then loads the fixtures' module.
pytest_plugins = ["celery_fencing.testing.plugin"]

__all__ = [
    "Arrival",
    "FencedWorker",
    "FencedWorkers",
    "FencingEvent",
    "FencingEvents",
    "PausePointTimeoutError",
    "PausePoints",
    "TcpProxy",
    "ZooKeeperEnsemble",
    "ZooKeeperError",
    "ZooKeeperNode",
    "ZooKeeperServer",
    "assert_applied_once",
    "assert_fenced_out",
    "expire_session",
    "fencing_flags",
    "free_ports",
    "pause_point",
    "record_events",
    "redis_redelivery_settings",
    "wait_for",
]

_LAZY = {
    "assert_applied_once": ".assertions",
    "assert_fenced_out": ".assertions",
    "FencingEvent": ".events",
    "FencingEvents": ".events",
    "record_events": ".events",
    "FencedWorkers": ".plugin",
    "free_ports": ".processes",
    "wait_for": ".processes",
    "TcpProxy": ".redelivery",
    "redis_redelivery_settings": ".redelivery",
    "FencedWorker": ".workers",
    "fencing_flags": ".workers",
    "ZooKeeperError": ".zookeeper",
    "ZooKeeperNode": ".zookeeper",
    "ZooKeeperServer": ".zookeeper",
    "ZooKeeperEnsemble": ".zookeeper_ensemble",
    "expire_session": ".zookeeper_ensemble",
}


__getattr__ = _lazy.lazy_names(__name__, _LAZY, globals())
