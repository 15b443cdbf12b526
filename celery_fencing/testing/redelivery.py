"""Re-delivery on demand: the Redis broker's visibility timeout made short, and RabbitMQ connections cut at a proxy.

**Redis.** kombu's Redis transport hands an unacknowledged message (a task
with ``acks_late`` that is still running) to another consumer once
``visibility_timeout`` has passed. kombu 5.x only sweeps for such messages
every ``unacked_restore_interval`` x ``unacked_restore_throttle`` seconds (10 x
10 by default, whatever the visibility timeout): :func:`redis_redelivery_settings`
sets all three, for the workers of a test. Nothing else is needed: a worker
held at a pause point (or frozen) past the timeout sees its task re-delivered.

**RabbitMQ** has no visibility timeout: it re-delivers an unacknowledged
message when the consumer's connection (or channel) closes, or when a delivery
is not acknowledged within ``consumer_timeout``. A worker that is merely paused
keeps its TCP connection, so nothing is re-delivered until AMQP heartbeats
(two missed intervals; Celery's default ``broker_heartbeat`` is 120 s) give it
up. Point the worker to be fenced out at a :class:`TcpProxy`
(``broker_url=proxy.proxied(url)``) and :meth:`TcpProxy.cut` its connections:
RabbitMQ sees the close at once and re-delivers.

Threads only, no dependencies. Every socket the proxy opened is closed by
:meth:`TcpProxy.close`, and its threads end with them.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["TcpProxy", "redis_redelivery_settings"]


def redis_redelivery_settings(visibility_timeout: float = 2.0) -> dict[str, Any]:
    """Celery settings that make the Redis broker re-deliver a running ``acks_late`` task after
    *visibility_timeout* seconds (checked about every second).

    For a test's workers (``FencedWorker(settings=...)`` merges them into the
    app's own ``broker_transport_options``); the task must be ``acks_late``.
    """
    number = visibility_timeout
    if isinstance(number, bool) or not isinstance(number, int | float) or not 0 < number < float("inf"):
        raise ValueError(f"visibility_timeout must be a positive number of seconds, not {visibility_timeout!r}")
    return {
        "broker_transport_options": {
            "visibility_timeout": float(visibility_timeout),
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }
    }


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to *target_host*:*target_port*, one upstream connection per client."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._threads: list[threading.Thread] = []
        self._closed = False
        #: Connections accepted so far (including cut ones).
        self.accepted = 0

    def start(self) -> TcpProxy:
        self._spawn(self._accept_loop, "proxy-accept")
        return self

    def url(self, scheme: str = "amqp", userinfo: str = "guest:guest", path: str = "//") -> str:
        return f"{scheme}://{userinfo}@127.0.0.1:{self.port}{path}"

    def proxied(self, url: str) -> str:
        """*url* (a broker URL of the target) with its host and port replaced by the proxy's."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{self.port}" if userinfo else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    @property
    def live(self) -> int:
        """Connections currently forwarded."""
        with self._lock:
            return len(self._pairs)

    def cut(self) -> int:
        """Close every forwarded connection, both ends, now; return how many. New connections are still accepted."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                _shut(sock)
        return len(pairs)

    def close(self) -> None:
        """Stop accepting, cut everything and wait for the proxy's threads."""
        self._closed = True
        _shut(self._listener)
        self.cut()
        for thread in self._threads:
            thread.join(10)

    def _spawn(self, target: object, name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _shut(client)
                continue
            with self._lock:
                if self._closed:
                    _shut(client)
                    _shut(upstream)
                    return
                self._pairs.append((client, upstream))
                self.accepted += 1
            self._spawn(self._pump, "proxy-up", client, upstream)
            self._spawn(self._pump, "proxy-down", upstream, client)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            # One side ended: end the other, so both peers see the connection go.
            with self._lock:
                self._pairs = [pair for pair in self._pairs if source not in pair]
            _shut(source)
            _shut(sink)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
