"""etcd v3 as the grantor: a token is the store revision of one write.

Minting is one ``put`` on a per-resource key, ``<prefix>/tokens/<name>``; the
token is ``header.revision`` of the put's response, which is the revision that
put created. etcd keeps one revision counter for its whole key space, advanced
through the raft log by every write, so revisions grow across leader changes,
member restarts, and deletion and re-creation of keys; they are 64-bit. Keys'
``version`` (reset when a key is re-created) is deliberately not used.

The client speaks etcd's JSON gRPC-gateway (``POST /v3/kv/put``, keys in
base64) with the standard library's ``http.client``: no dependency, and every
request has its own socket timeout. The maintained alternatives were heavier
for what a grantor needs: ``etcd3`` (unmaintained since 2020, generated code for
an old protobuf, grpcio) and ``etcd3gw`` (requests, futurist, pbr).

Exclusive mode
--------------
``with source.lease(resource) as lease:`` grants an etcd lease (``lease_ttl``
seconds, kept alive by a thread of the lease), takes etcd's lock on
``<prefix>/locks/<name>`` with it (``/v3/lock/lock``: the lock key is
``<name>/<lease id>``, deleted when the lease ends), and mints in one
transaction ``IF create_revision(lock key) == ours THEN put(token key)``: a
holder whose lock key is gone (lease expired, revoked, key deleted) can never
mint. The token is that put's revision, so tokens of both modes are revisions
of writes to the same key and order in mint order; it is above the lock key's
create revision too. The lock is for efficiency; the token stays the safety.

Grantor identity
----------------
The first source to reach a cluster stores a random id under
``<prefix>/grantor`` (a transaction that puts it only if the key was never
created); every token carries it (``etcd-<32 hex digits>``) and the gates keep
it with the mark, so a wiped or different cluster, whose revisions count from
the start again, meets :class:`~celery_fencing.GrantorMismatchError` at the
gates instead of being compared with the old marks. Each mint is a
transaction ``IF value(<prefix>/grantor) == <id> THEN put(token key)``, so a
token never carries the id of data it was not minted from; when the id
changed, the source reads the new one and mints again. A snapshot restore
restores the id with the data (restore with ``--bump-revision``, below).

Every response header also names the ``cluster_id`` (and the ``member_id`` that
answered: members change on failover, so it is logged, not checked). The
source pins the cluster id on first contact (or takes ``cluster_id=`` from the
caller) and refuses to mint from any other cluster. It also refuses a token that
is not above every token it minted before the mint was sent: revisions go
backwards only when the grantor's state was replaced, as by
``etcdutl snapshot restore`` without ``--bump-revision``, which re-issues
revisions already handed out (see docs/etcd.md).

Error handling
--------------
No call can hang: each request is bounded by the time left before the
caller's deadline (``timeout``). A member that refuses the connection, times
out, or answers "unavailable", "no leader" or "leader changed" is left for the
next endpoint, with a short backoff once every endpoint failed, until the
deadline; then :class:`~celery_fencing.TokenUnavailableError` is raised with
the last error chained. A put whose reply was lost may still have been
applied: that only advances the revision, and its token escapes no one.

Threads and processes
---------------------
A source is thread-safe: each thread keeps its own keep-alive HTTP connection
per endpoint. Connections never cross ``fork()``: a child notices the new pid
and opens its own, leaving the parent's untouched; leases taken in the parent
are lost in the child.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from ..exceptions import FencingConfigurationError, InvalidTokenError, LeaseLostError, TokenUnavailableError
from ..lease_state import LeaseState
from ..token import FencingToken, validate_grantor, validate_resource, validate_token_value

__all__ = ["EtcdLease", "EtcdTokenSource", "resource_to_key_name"]

log = logging.getLogger(__name__)

_DEFAULT_PORT = 2379
# Kept readable in keys besides letters, digits and "_.-~"; "/" is always encoded,
# so the lock prefix "<name>/" of one resource never covers another resource.
_KEPT = ":@+=,!"
_HOST_PORT = re.compile(r"^(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+))(?::(?P<port>[0-9]{1,5}))?$")
# gRPC codes and etcd errors after which another member, or a moment, may succeed.
_RETRYABLE_CODES = frozenset({1, 4, 10, 14})  # CANCELLED, DEADLINE_EXCEEDED, ABORTED, UNAVAILABLE
_RETRYABLE_TEXT = ("leader changed", "no leader", "timed out", "not capable", "too many requests", "stopped")


class _Retryable(Exception):
    """A failure of one member; the next endpoint (or the next round) may succeed."""


def resource_to_key_name(resource: str) -> str:
    """Map a resource name to the last component of its etcd keys, reversibly (percent-encoding).

    :raises InvalidTokenError: *resource* is not a valid resource name.
    """
    return quote(validate_resource(resource), safe=_KEPT)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _validate_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise FencingConfigurationError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def _validate_endpoints(endpoints: object, url: str | None = None) -> tuple[str, ...]:
    where = f" in {url!r}" if url is not None else ""
    items: Sequence[object]
    if isinstance(endpoints, str):
        items = endpoints.split(",")
    elif isinstance(endpoints, Sequence):
        items = endpoints
    else:
        raise FencingConfigurationError(f"etcd endpoints must be 'host:port[,host:port...]'{where}, got {endpoints!r}")
    result = []
    for item in items:
        if not isinstance(item, str):
            raise FencingConfigurationError(f"malformed etcd endpoint {item!r}{where}: expected host:port")
        match = _HOST_PORT.match(item.strip())
        if match is None:
            raise FencingConfigurationError(f"malformed etcd endpoint {item!r}{where}: expected host:port")
        host = match.group("ipv6") or match.group("host")
        port = int(match.group("port") or _DEFAULT_PORT)
        if not 0 < port < 65536:
            raise FencingConfigurationError(f"etcd port {port} out of range{where}")
        result.append(f"[{host}]:{port}" if match.group("ipv6") else f"{host}:{port}")
    if not result:
        raise FencingConfigurationError(f"no etcd endpoint given{where}")
    return tuple(result)


def _validate_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not prefix.startswith("/") or prefix.rstrip("/") == "":
        raise FencingConfigurationError(f"etcd key prefix must look like '/fencing', got {prefix!r}")
    for char in prefix:
        if ord(char) < 0x20 or ord(char) == 0x7F:
            raise FencingConfigurationError(f"etcd key prefix {prefix!r} contains a control character")
    return prefix.rstrip("/")


def _int_field(message: dict[str, Any], name: str, default: int | None = None) -> int:
    # The gateway renders int64 fields as JSON strings and omits zero values.
    raw = message.get(name)
    if raw is None:
        if default is None:
            raise ValueError(f"etcd response has no {name!r}: {message!r:.200}")
        return default
    return int(raw)


class EtcdLease(LeaseState):
    """An exclusive hold on a resource through etcd's lock, and the token minted under it.

    Obtained from :meth:`EtcdTokenSource.lease`. The lease is *lost* when
    its etcd lease expires or cannot be renewed within its TTL, when the lock
    key disappears, or when the source closes; ``lost`` then stays true and
    callbacks registered with :meth:`on_lost` run once, each in a short-lived
    thread. Thread-safe; lost in a forked child.
    """

    _log = log

    def __init__(self, source: EtcdTokenSource, resource: str, lease_id: int, ttl: float) -> None:
        super().__init__(resource)
        #: The etcd lease id that holds the lock key.
        self.lease_id = lease_id
        self.ttl = ttl
        #: The lock key, ``<prefix>/locks/<name>/<lease id in hex>``, set once the lock is held.
        self.lock_key: str | None = None
        #: The lock key's create revision: the mint transaction compares against it.
        self.lock_revision = 0
        #: The grantor id the lease's tokens carry, read before the lock was taken.
        self.grantor = ""
        self._source = source
        self._keeper: threading.Thread | None = None

    def mint(self, *, timeout: float | None = None) -> FencingToken:
        """Mint a new, larger token under the lock, with the same transaction check.

        :raises LeaseLostError: the lease is lost, or etcd found the lock key gone.
        :raises TokenUnavailableError: etcd did not answer within *timeout*.
        """
        self.check()
        token = self._source._mint_locked(self, self._source._deadline(timeout))
        self._token = token
        return token

    # Internal -----------------------------------------------------------------

    def _keep_alive(self) -> None:
        """Renew the etcd lease every third of its TTL; mark the lease lost when that fails for a TTL."""
        source = self._source
        renewed = time.monotonic()
        interval = self.ttl / 3
        while not self._released.wait(interval):
            if self._lost.is_set() or source._closed:
                return
            try:
                deadline = time.monotonic() + interval
                reply = source._call("/v3/lease/keepalive", {"ID": str(self.lease_id)}, deadline, self.resource)
                result = reply.get("result", reply)
                if _int_field(result, "TTL", 0) <= 0:
                    self._mark_lost("the etcd lease expired")
                    return
                if self.lock_key is not None:
                    found = source._call(
                        "/v3/kv/range",
                        {"key": _b64(self.lock_key), "count_only": True},
                        deadline,
                        self.resource,
                    )
                    if _int_field(found, "count", 0) == 0:
                        self._mark_lost("the lock key was deleted")
                        return
                renewed = time.monotonic()
            except (TokenUnavailableError, ValueError) as exc:
                if "lease not found" in str(exc):
                    self._mark_lost("the etcd lease expired (etcd no longer knows it)")
                    return
                # Not renewed yet: the lease may still live on the server. Past its TTL
                # since the last renewal, another holder may have the lock.
                if time.monotonic() - renewed >= self.ttl:
                    self._mark_lost(f"the etcd lease could not be renewed within its TTL: {exc}")
                    return

    def __repr__(self) -> str:
        return f"<EtcdLease {self.resource!r} {self._token!r} {self._state_word()}>"


class EtcdTokenSource:
    """Mints fencing tokens as revisions of writes to an etcd v3 cluster.

    :param endpoints: ``"h1:2379,h2:2379"`` or a sequence of ``host:port``;
        the client gateway of each member (plain HTTP).
    :param prefix: the key prefix under which tokens and locks live.
    :param timeout: default bound, in seconds, on ``mint``, ``connect`` and
        ``lease`` (every request and any wait for the lock).
    :param lease_ttl: TTL of the etcd lease behind an exclusive lease: a holder
        that stops renewing loses the lock this long after its last renewal.
    :param cluster_id: the etcd cluster id to accept; default: the first one seen.
    :raises FencingConfigurationError: for bad arguments.
    """

    volatile = False
    #: ``ceiling()`` is one counter for every resource: the store revision.
    ceiling_is_global = True

    def __init__(
        self,
        endpoints: str | Sequence[str] = "127.0.0.1:2379",
        *,
        prefix: str = "/fencing",
        timeout: float = 5.0,
        lease_ttl: float = 10.0,
        cluster_id: int | None = None,
    ) -> None:
        self.endpoints = _validate_endpoints(endpoints)
        self.prefix = _validate_prefix(prefix)
        self.timeout = _validate_seconds("timeout", timeout)
        self.lease_ttl = _validate_seconds("lease_ttl", lease_ttl)
        if self.lease_ttl < 2:
            raise FencingConfigurationError(f"lease_ttl must be at least 2 seconds (etcd's minimum), got {lease_ttl!r}")
        if cluster_id is not None and (isinstance(cluster_id, bool) or not isinstance(cluster_id, int)):
            raise FencingConfigurationError(f"cluster_id must be an int, got {cluster_id!r}")
        self._cluster_id = cluster_id
        self._pid = os.getpid()
        self._local = threading.local()
        self._preferred = 0
        self._closed = False
        # Guards _floor, _preferred, _cluster_id and _leases; never held across a request.
        self._lock = threading.Lock()
        # The highest token this source handed out: a later mint must exceed it.
        self._floor = 0
        self._leases: set[EtcdLease] = set()
        self._wake = threading.Event()
        # The cluster's grantor id, once read (every mint re-checks it in its transaction).
        self._grantor: str | None = None

    @classmethod
    def from_url(cls, url: str) -> EtcdTokenSource:
        """Build a source from ``etcd://h1:2379,h2:2379/prefix?timeout=5&lease_ttl=10&cluster_id=<n>``.

        The path is the key prefix (default ``/fencing``); ``cluster_id`` is
        decimal or ``0x``-hex, as ``etcdctl endpoint status`` prints it.

        :raises FencingConfigurationError: naming what is wrong with *url*.
        """
        from . import _parse_seconds

        if not isinstance(url, str):
            raise FencingConfigurationError(f"etcd URL must be a str, got {type(url).__name__}")
        from . import split_url

        parts = split_url(url, "etcd URL")
        if parts.scheme.lower() != "etcd":
            raise FencingConfigurationError(f"not an etcd:// URL: {url!r}")
        if "@" in parts.netloc:
            raise FencingConfigurationError(f"credentials in the etcd URL are not supported: {url!r}")
        if not parts.netloc:
            raise FencingConfigurationError(f"etcd:// URL {url!r} names no host")
        if parts.fragment:
            raise FencingConfigurationError(f"etcd:// URL {url!r} must not have a #fragment")
        endpoints = _validate_endpoints(parts.netloc, url)
        path = unquote(parts.path)
        prefix = path if path not in ("", "/") else "/fencing"
        try:
            params = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query)))
        except ValueError as exc:
            raise FencingConfigurationError(f"malformed query string in etcd URL {url!r}: {exc}") from exc
        allowed = {"timeout", "lease_ttl", "cluster_id"}
        unknown = sorted(set(params) - allowed)
        if unknown:
            raise FencingConfigurationError(
                f"unknown parameter(s) {', '.join(unknown)} in {url!r}; etcd:// accepts {', '.join(sorted(allowed))}"
            )
        cluster_id = None
        raw_id = params.pop("cluster_id", None)
        if raw_id is not None:
            try:
                cluster_id = int(raw_id, 0)
            except ValueError:
                raise FencingConfigurationError(f"cluster_id={raw_id!r} in {url!r} is not an integer") from None
        seconds = {name: _parse_seconds(url, name, raw) for name, raw in params.items()}
        try:
            prefix = _validate_prefix(prefix)
        except FencingConfigurationError as exc:
            raise FencingConfigurationError(f"{exc} (in {url!r})") from None
        return cls(endpoints, prefix=prefix, cluster_id=cluster_id, **seconds)

    # Public API ----------------------------------------------------------------

    @property
    def cluster_id(self) -> int | None:
        """The etcd cluster id this source accepts: given, or pinned on first contact."""
        return self._cluster_id

    def connect(self, *, timeout: float | None = None) -> None:
        """Reach a member now (instead of on first use) and pin the cluster id.

        :raises TokenUnavailableError: no member answered within *timeout*.
        """
        self._call("/v3/kv/range", {"key": _b64(self.prefix), "count_only": True}, self._deadline(timeout), None)

    def mint(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        """Mint a token for *resource*: the revision of one put on its key.

        Thread-safe; returns within *timeout* seconds (default: the
        constructor's) or raises.

        :raises InvalidTokenError: *resource* is not a valid resource name (nothing is sent).
        :raises TokenUnavailableError: no member answered in time, the cluster
            is not the pinned one, the revision went backwards, the source is closed.
        """
        validate_resource(resource)
        deadline = self._deadline(timeout)
        grantor = self._grantor or self._read_grantor(deadline, resource)
        for _ in range(3):
            floor = self._floor
            reply = self._call(
                "/v3/kv/txn",
                {
                    "compare": [self._grantor_compare(grantor)],
                    "success": [{"request_put": {"key": _b64(self._token_key(resource)), "value": ""}}],
                },
                deadline,
                resource,
                what="txn [compare grantor, put]",
            )
            # A failed transaction answers 200 without "succeeded" (false is omitted).
            if reply.get("succeeded"):
                return self._token_from(resource, reply, floor, grantor)
            grantor = self._read_grantor(deadline, resource)
        raise TokenUnavailableError(f"the etcd grantor id under {self.prefix} kept changing", resource=resource)

    def ceiling(self, resource: str | None = None, *, timeout: float | None = None) -> int:
        """Return the cluster's current revision: no token minted so far is above it. Writes nothing.

        :raises TokenUnavailableError: no member answered within *timeout*.
        """
        reply = self._call(
            "/v3/kv/range", {"key": _b64(self.prefix), "count_only": True}, self._deadline(timeout), resource
        )
        try:
            return _int_field(reply.get("header") or {}, "revision")
        except ValueError as exc:
            raise TokenUnavailableError(f"etcd returned no revision: {exc}", resource=resource) from exc

    def grantor_id(self, *, timeout: float | None = None) -> str:
        """Return the cluster's grantor id, creating it on first use (see "Grantor identity").

        :raises TokenUnavailableError: no member answered within *timeout*.
        """
        return self._read_grantor(self._deadline(timeout), None)

    def _grantor_key(self) -> str:
        return f"{self.prefix}/grantor"

    def _grantor_compare(self, grantor: str) -> dict[str, Any]:
        return {"key": _b64(self._grantor_key()), "target": "VALUE", "result": "EQUAL", "value": _b64(grantor)}

    def _read_grantor(self, deadline: float, resource: str | None) -> str:
        """Read the grantor id, or store a new one if the key was never created; cache it."""
        key = _b64(self._grantor_key())
        candidate = f"etcd-{uuid.uuid4().hex}"
        reply = self._call(
            "/v3/kv/txn",
            {
                "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
                "success": [{"request_put": {"key": key, "value": _b64(candidate)}}],
                "failure": [{"request_range": {"key": key}}],
            },
            deadline,
            resource,
            what="txn [create grantor id]",
        )
        if reply.get("succeeded"):
            grantor = candidate
            log.warning("etcd %s%s had no grantor id: created %s", ",".join(self.endpoints), self.prefix, grantor)
        else:
            try:
                (response,) = reply["responses"]
                (kv,) = response["response_range"]["kvs"]
                grantor = validate_grantor(base64.b64decode(kv.get("value", "")).decode("ascii")) or ""
            except (KeyError, TypeError, ValueError, InvalidTokenError) as exc:
                raise TokenUnavailableError(
                    f"{self._grantor_key()} does not hold a grantor id: {exc!r:.200}", resource=resource
                ) from exc
        with self._lock:
            self._grantor = grantor
        return grantor

    @contextlib.contextmanager
    def lease(self, resource: str, *, timeout: float | None = None) -> Iterator[EtcdLease]:
        """Hold the resource's etcd lock, with a token minted under it.

        ::

            with source.lease("account:42", timeout=10) as lease:
                gate.claim(lease.token)
                ...
                lease.check()       # raises LeaseLostError once lost

        Granting the etcd lease, waiting for the lock and minting take at most
        *timeout* seconds together. Leaving the block revokes the etcd lease,
        which deletes the lock key; it never raises because the lease was lost.

        :raises TokenUnavailableError: the lock was not obtained within
            *timeout*, or etcd is unreachable; no lock is left behind.
        """
        validate_resource(resource)
        deadline = self._deadline(timeout)
        held = self._acquire(resource, deadline)
        try:
            yield held
        finally:
            self._release(held)

    def close(self) -> None:
        """Revoke held leases (best effort, bounded) and close connections. Idempotent."""
        with self._lock:
            if self._closed:
                return
            leases, self._leases = list(self._leases), set()
        for held in leases:
            held._mark_lost("the token source was closed")
            self._revoke(held.lease_id, wait=True)
        with self._lock:
            self._closed = True
        self._wake.set()
        if self._pid == os.getpid():
            for conn in self._connections().values():
                conn.close()
        self._local = threading.local()

    def __enter__(self) -> EtcdTokenSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<EtcdTokenSource {','.join(self.endpoints)}{self.prefix}>"

    # Keys and tokens -------------------------------------------------------------

    def _token_key(self, resource: str) -> str:
        return f"{self.prefix}/tokens/{resource_to_key_name(resource)}"

    def _lock_name(self, resource: str) -> str:
        return f"{self.prefix}/locks/{resource_to_key_name(resource)}"

    def _token_from(self, resource: str, reply: dict[str, Any], floor: int, grantor: str) -> FencingToken:
        try:
            revision = _int_field(reply.get("header") or {}, "revision")
            token = FencingToken(resource, validate_token_value(revision), grantor)
        except (ValueError, InvalidTokenError) as exc:
            raise TokenUnavailableError(f"etcd returned an unusable revision: {exc}", resource=resource) from exc
        with self._lock:
            if token.value <= floor:
                raise TokenUnavailableError(
                    f"etcd revision went backwards: minted {token.value} for {resource!r} after this source had "
                    f"minted {floor}; the cluster's state was replaced (a snapshot restored without "
                    "--bump-revision?) and re-issues revisions already handed out",
                    resource=resource,
                )
            self._floor = max(self._floor, token.value)
        return token

    # Exclusive mode ------------------------------------------------------------

    def _acquire(self, resource: str, deadline: float) -> EtcdLease:
        grantor = self._grantor or self._read_grantor(deadline, resource)
        granted = self._call("/v3/lease/grant", {"TTL": math.ceil(self.lease_ttl)}, deadline, resource, what="grant")
        try:
            lease_id = _int_field(granted, "ID")
        except ValueError as exc:
            raise TokenUnavailableError(f"etcd granted no lease: {exc}", resource=resource) from exc
        held = EtcdLease(self, resource, lease_id, self.lease_ttl)
        held.grantor = grantor
        with self._lock:
            self._leases.add(held)
        try:
            # The keeper renews from now on: waiting for the lock may take longer than the TTL.
            held._keeper = threading.Thread(
                target=held._keep_alive, name=f"fencing-etcd-keepalive:{resource}", daemon=True
            )
            held._keeper.start()
            try:
                locked = self._call(
                    "/v3/lock/lock",
                    {"name": _b64(self._lock_name(resource)), "lease": str(lease_id)},
                    deadline,
                    resource,
                    what="lock",
                    retry=False,
                )
            except TokenUnavailableError as exc:
                raise TokenUnavailableError(
                    f"the lease on {resource!r} was not obtained within the timeout (another holder kept it, "
                    f"or etcd did not answer): {exc}",
                    resource=resource,
                ) from exc
            lock_key = base64.b64decode(locked.get("key", "")).decode("utf-8")
            found = self._call("/v3/kv/range", {"key": _b64(lock_key)}, deadline, resource, what="range")
            kvs = found.get("kvs") or []
            if not kvs:
                raise TokenUnavailableError(f"the lock key of {resource!r} vanished right after locking")
            held.lock_key = lock_key
            held.lock_revision = _int_field(kvs[0], "create_revision")
            if held.lost:
                raise TokenUnavailableError(f"lease on {resource!r} was lost while being taken: {held.lost_reason}")
            try:
                held._token = self._mint_locked(held, deadline)
            except LeaseLostError as exc:
                raise TokenUnavailableError(f"lease on {resource!r} was lost while being taken: {exc}") from exc
        except BaseException as exc:
            self._release(held, wait=False)
            if isinstance(exc, ValueError):
                raise TokenUnavailableError(f"malformed etcd lock reply: {exc}", resource=resource) from exc
            raise
        return held

    def _mint_locked(self, held: EtcdLease, deadline: float) -> FencingToken:
        """Mint with ``IF create_revision(lock key) == ours AND value(grantor key) == ours THEN put(token key)``."""
        resource = held.resource
        assert held.lock_key is not None
        floor = self._floor
        reply = self._call(
            "/v3/kv/txn",
            {
                "compare": [
                    {
                        "key": _b64(held.lock_key),
                        "target": "CREATE",
                        "result": "EQUAL",
                        "create_revision": str(held.lock_revision),
                    },
                    self._grantor_compare(held.grantor),
                ],
                "success": [{"request_put": {"key": _b64(self._token_key(resource)), "value": ""}}],
            },
            deadline,
            resource,
            what="txn [compare lock key, put]",
        )
        # A failed transaction answers 200 without "succeeded" (false is omitted).
        if not reply.get("succeeded"):
            held._mark_lost("etcd found the lock key gone (or the grantor id changed) when minting")
            raise LeaseLostError(
                f"lease on {resource!r} is lost: its lock key {held.lock_key!r} no longer exists, "
                "or the grantor id changed",
                resource=resource,
            )
        return self._token_from(resource, reply, floor, held.grantor)

    def _release(self, held: EtcdLease, *, wait: bool = True) -> None:
        with self._lock:
            self._leases.discard(held)
        held._mark_released()
        if self._pid != os.getpid() or self._closed:
            return
        self._revoke(held.lease_id, wait=wait)

    def _revoke(self, lease_id: int, *, wait: bool) -> None:
        # Revoking deletes the lock key at once; if it fails, the key goes when the TTL runs out.
        def revoke() -> None:
            try:
                self._call("/v3/lease/revoke", {"ID": str(lease_id)}, self._deadline(None), None, what="revoke")
            except TokenUnavailableError as exc:
                log.info("could not revoke etcd lease %x (it expires by itself): %s", lease_id, exc)

        if wait:
            revoke()
        else:
            threading.Thread(target=revoke, name="fencing-etcd-revoke", daemon=True).start()

    # Requests ------------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> float:
        seconds = self.timeout if timeout is None else _validate_seconds("timeout", timeout)
        return time.monotonic() + seconds

    def _connections(self) -> dict[str, http.client.HTTPConnection]:
        if self._pid != os.getpid():
            # A forked child: the parent's sockets and leases are the parent's. Forget them unclosed.
            self._pid = os.getpid()
            self._local = threading.local()
            self._lock = threading.Lock()
            leases, self._leases = self._leases, set()
            for held in leases:
                held._lost_reason = held._lost_reason or "the process forked"
                held._lost.set()
        connections: dict[str, http.client.HTTPConnection] | None = getattr(self._local, "connections", None)
        if connections is None:
            connections = self._local.connections = {}
        return connections

    def _call(
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
            if self._closed:
                raise TokenUnavailableError("EtcdTokenSource is closed", resource=resource)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TokenUnavailableError(
                    f"no etcd member answered {what} within the timeout ({','.join(self.endpoints)}): {last}",
                    resource=resource,
                ) from last
            with self._lock:
                index = self._preferred
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
                    if self._preferred == index:
                        self._preferred = index + 1
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
            if self._cluster_id is None:
                self._cluster_id = cluster_id
                log.info("etcd token source pinned cluster id %x (member %s answered)", cluster_id, endpoint)
                return
            expected = self._cluster_id
        if cluster_id != expected:
            raise TokenUnavailableError(
                f"etcd member {endpoint} belongs to cluster {cluster_id:x}, not {expected:x} that this source "
                "minted from: a restored or re-created cluster may re-issue revisions already handed out. "
                "After `etcdutl snapshot restore --bump-revision`, pin the new id (cluster_id= in the URL)",
                resource=resource,
            )


class _Refused(Exception):
    """etcd answered, and refused the request for a reason another member would share."""
