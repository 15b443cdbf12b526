"""A TCP proxy on loopback whose connections a test can cut, as a network partition or a dead NAT entry would.

RabbitMQ has no visibility timeout: it re-delivers an unacknowledged message
when the consumer's connection (or channel) closes, or when a delivery is not
acknowledged within ``consumer_timeout``. A worker that is merely paused keeps
its TCP connection, so nothing is re-delivered until AMQP heartbeats (two
missed intervals; Celery's default ``broker_heartbeat`` is 120 s) give it up.
Cutting the proxied connection makes RabbitMQ see the close at once.

Threads only, no dependencies. Every socket it opened is closed by
:meth:`TcpProxy.close`, and its threads end with them.
"""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["TcpProxy"]


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
