"""Requests to etcd's JSON gRPC-gateway: one member after another until one answers or the deadline passes.

Each request is a ``POST`` with the standard library's ``http.client``,
bounded by the time left before the caller's deadline. A member that refuses
the connection, times out, or answers "unavailable", "no leader" or "leader
changed" is left for the next endpoint, with a short backoff once every
endpoint failed; past the deadline
:class:`~celery_fencing.TokenUnavailableError` is raised with the last error
chained. Every reply's header is checked against the pinned cluster id.
Each thread keeps its own keep-alive connection per endpoint; a forked child
notices the new pid and opens its own, leaving the parent's untouched.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ...exceptions import TokenUnavailableError

__all__ = ["Gateway", "int_field"]

# One logger for the whole package, named as the module was before it became one.
log = logging.getLogger(__package__)

# gRPC codes and etcd errors after which another member, or a moment, may succeed.
_RETRYABLE_CODES = frozenset({1, 4, 10, 14})  # CANCELLED, DEADLINE_EXCEEDED, ABORTED, UNAVAILABLE
_RETRYABLE_TEXT = ("leader changed", "no leader", "timed out", "not capable", "too many requests", "stopped")


class _Retryable(Exception):
    """A failure of one member; the next endpoint (or the next round) may succeed."""


class _Refused(Exception):
    """etcd answered, and refused the request for a reason another member would share."""


def int_field(message: dict[str, Any], name: str, default: int | None = None) -> int:
    """The int64 field *name* of a reply (or *default*); :class:`ValueError` when it is missing."""
    # The gateway renders int64 fields as JSON strings and omits zero values.
    raw = message.get(name)
    if raw is None:
        if default is None:
            raise ValueError(f"etcd response has no {name!r}: {message!r:.200}")
        return default
    return int(raw)


class Gateway:
    """The members of one cluster, as one endpoint that fails over. Thread-safe.

    :param endpoints: ``host:port`` of each member's gateway (checked).
    :param cluster_id: the cluster id to accept; ``None``: the first one seen.
    :param after_fork: called in a forked child, before its first request,
        once this gateway has dropped the parent's connections.
    """

    def __init__(self, endpoints: tuple[str, ...], cluster_id: int | None, *, after_fork: Callable[[], None]) -> None:
        self.endpoints = endpoints
        self.cluster_id = cluster_id
        #: Index of the member that answered last: the next request starts there.
        self.preferred = 0
        self.closed = False
        self._after_fork = after_fork
        self._pid = os.getpid()
        self._local = threading.local()
        # Guards preferred and cluster_id; never held across a request.
        self._lock = threading.Lock()
        self._wake = threading.Event()

    def forked(self) -> bool:
        """Whether this process is a child that has not sent a request yet (the connections are the parent's)."""
        return self._pid != os.getpid()

    def close(self) -> None:
        """Refuse further requests, wake a request backing off, and close this thread's connections."""
        with self._lock:
            self.closed = True
        self._wake.set()
        if not self.forked():
            for conn in self._connections().values():
                conn.close()
        self._local = threading.local()

    def _connections(self) -> dict[str, http.client.HTTPConnection]:
        if self._pid != os.getpid():
            # A forked child: the parent's sockets and leases are the parent's. Forget them unclosed.
            self._pid = os.getpid()
            self._local = threading.local()
            self._lock = threading.Lock()
            self._after_fork()
        connections: dict[str, http.client.HTTPConnection] | None = getattr(self._local, "connections", None)
        if connections is None:
            connections = self._local.connections = {}
        return connections

    def call(
        self,
        path: str,
        body: dict[str, Any],
        deadline: float,
        resource: str | None,
        *,
        what: str | None = None,
        retry: bool = True,
    ) -> dict[str, Any]:
        """POST *body* to *path* on one member after another until one answers or *deadline* passes.

        With ``retry=False`` (the blocking lock call) a member that does not
        answer in time ends the call: the wait itself is what timed out.
        """
        what = what or path
        attempt = 0
        last: BaseException | None = None
        while True:
            if self.closed:
                raise TokenUnavailableError("EtcdTokenSource is closed", resource=resource)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TokenUnavailableError(
                    f"no etcd member answered {what} within the timeout ({','.join(self.endpoints)}): {last}",
                    resource=resource,
                ) from last
            with self._lock:
                index = self.preferred
            endpoint = self.endpoints[index % len(self.endpoints)]
            # A member that accepts connections but never answers (paused, partitioned) must not
            # take the whole deadline while others could answer: half of what is left, at least 1 s.
            per_try = remaining if len(self.endpoints) == 1 or not retry else min(remaining, max(1.0, remaining / 2))
            try:
                reply = self._post(endpoint, path, body, per_try)
            except _Retryable as exc:
                last = exc.__cause__ or exc
                if isinstance(last, TimeoutError) and not retry:
                    raise TokenUnavailableError(
                        f"etcd did not answer {what} within the timeout ({endpoint})", resource=resource
                    ) from last
                with self._lock:
                    if self.preferred == index:
                        self.preferred = index + 1
                attempt += 1
                if attempt % len(self.endpoints) == 0:
                    # Every member failed once: back off a little (an election takes about a second).
                    backoff = min(0.05 * 2 ** (attempt // len(self.endpoints)), 0.5)
                    self._wake.wait(max(0.0, min(backoff, deadline - time.monotonic())))
                continue
            except _Refused as exc:
                raise TokenUnavailableError(f"etcd refused {what} ({endpoint}): {exc}", resource=resource) from exc
            self._check_identity(reply, endpoint, resource)
            return reply

    def _post(self, endpoint: str, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        connections = self._connections()
        payload = json.dumps(body).encode("utf-8")
        for fresh in (False, True):
            conn = connections.get(endpoint)
            reused = conn is not None and conn.sock is not None
            if conn is None:
                host, _, port = endpoint.rpartition(":")
                conn = connections[endpoint] = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
            try:
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                else:
                    conn.timeout = timeout
                conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                status, raw = response.status, response.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                del connections[endpoint]
                # A kept-alive connection the member closed meanwhile: one fresh try, at once.
                if reused and not fresh and not isinstance(exc, TimeoutError):
                    continue
                raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
        try:
            reply = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise _Retryable(f"{endpoint} answered HTTP {status} with no JSON: {raw[:200]!r}") from exc
        if not isinstance(reply, dict):
            raise _Retryable(f"{endpoint} answered HTTP {status} with {raw[:200]!r}")
        error = reply.get("error")
        if status == 200 and error is None:
            return reply
        code = reply.get("code")
        message = str(reply.get("message") or error or f"HTTP {status}")
        if code in _RETRYABLE_CODES or status >= 500 or any(text in message for text in _RETRYABLE_TEXT):
            raise _Retryable(f"{endpoint}: {message}")
        raise _Refused(f"{message} (code {code}, HTTP {status})")

    def _check_identity(self, reply: dict[str, Any], endpoint: str, resource: str | None) -> None:
        header = reply.get("header")
        if header is None and isinstance(reply.get("result"), dict):
            header = reply["result"].get("header")
        if not isinstance(header, dict) or "cluster_id" not in header:
            return
        cluster_id = int(header["cluster_id"])
        with self._lock:
            if self.cluster_id is None:
                self.cluster_id = cluster_id
                log.info("etcd token source pinned cluster id %x (member %s answered)", cluster_id, endpoint)
                return
            expected = self.cluster_id
        if cluster_id != expected:
            raise TokenUnavailableError(
                f"etcd member {endpoint} belongs to cluster {cluster_id:x}, not {expected:x} that this source "
                "minted from: a restored or re-created cluster may re-issue revisions already handed out. "
                "After `etcdutl snapshot restore --bump-revision`, pin the new id (cluster_id= in the URL)",
                resource=resource,
            )
