"""EtcdTokenSource: minting revisions, and the facade over the gateway, the grantor id and the leases.

A token is ``header.revision`` of one put on ``<prefix>/tokens/<name>``, sent
as the transaction ``IF value(<prefix>/grantor) == <id> THEN put``; when the
id changed, the source reads the new one and mints again (at most three
times). Errors: everything that prevents minting raises
:class:`~celery_fencing.TokenUnavailableError` within the call's timeout; a
bad resource name raises :class:`~celery_fencing.InvalidTokenError` before
anything is sent.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence

from ...exceptions import FencingConfigurationError, TokenUnavailableError
from ...token import FencingToken, validate_resource
from ...values import seconds as validated_seconds
from . import config
from .gateway import Gateway, int_field
from .grantor import Grantor
from .keys import Keys, b64
from .lease import EtcdLease, Leases

__all__ = ["EtcdTokenSource"]


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
        self.endpoints = config.validate_endpoints(endpoints)
        self.prefix = config.validate_prefix(prefix)
        self.timeout = validated_seconds("timeout", timeout)
        self.lease_ttl = validated_seconds("lease_ttl", lease_ttl)
        if self.lease_ttl < 2:
            raise FencingConfigurationError(f"lease_ttl must be at least 2 seconds (etcd's minimum), got {lease_ttl!r}")
        if cluster_id is not None and (isinstance(cluster_id, bool) or not isinstance(cluster_id, int)):
            raise FencingConfigurationError(f"cluster_id must be an int, got {cluster_id!r}")
        self._keys = Keys(self.prefix)
        self._gateway = Gateway(self.endpoints, cluster_id, after_fork=self._after_fork)
        self._grantor = Grantor(self._gateway, self._keys)
        self._leases = Leases(
            self._gateway, self._keys, self._grantor, lease_ttl=self.lease_ttl, deadline=self._deadline
        )

    @classmethod
    def from_url(cls, url: str) -> EtcdTokenSource:
        """Build a source from ``etcd://h1:2379,h2:2379/prefix?timeout=5&lease_ttl=10&cluster_id=<n>``.

        The path is the key prefix (default ``/fencing``); ``cluster_id`` is
        decimal or ``0x``-hex, as ``etcdctl endpoint status`` prints it.

        :raises FencingConfigurationError: naming what is wrong with *url*.
        """
        return cls(**config.parse_url(url))

    # Public API ----------------------------------------------------------------

    @property
    def cluster_id(self) -> int | None:
        """The etcd cluster id this source accepts: given, or pinned on first contact."""
        return self._gateway.cluster_id

    def connect(self, *, timeout: float | None = None) -> None:
        """Reach a member now (instead of on first use) and pin the cluster id.

        :raises TokenUnavailableError: no member answered within *timeout*.
        """
        self._gateway.call("/v3/kv/range", {"key": b64(self.prefix), "count_only": True}, self._deadline(timeout), None)

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
        grantor = self._grantor.current(deadline, resource)
        for _ in range(3):
            floor = self._grantor.floor
            reply = self._gateway.call(
                "/v3/kv/txn",
                {
                    "compare": [self._grantor.compare(grantor)],
                    "success": [{"request_put": {"key": b64(self._keys.token(resource)), "value": ""}}],
                },
                deadline,
                resource,
                what="txn [compare grantor, put]",
            )
            # A failed transaction answers 200 without "succeeded" (false is omitted).
            if reply.get("succeeded"):
                return self._grantor.token_from(resource, reply, floor, grantor)
            grantor = self._grantor.read(deadline, resource)
        raise TokenUnavailableError(f"the etcd grantor id under {self.prefix} kept changing", resource=resource)

    def ceiling(self, resource: str | None = None, *, timeout: float | None = None) -> int:
        """Return the cluster's current revision: no token minted so far is above it. Writes nothing.

        :raises TokenUnavailableError: no member answered within *timeout*.
        """
        reply = self._gateway.call(
            "/v3/kv/range", {"key": b64(self.prefix), "count_only": True}, self._deadline(timeout), resource
        )
        try:
            return int_field(reply.get("header") or {}, "revision")
        except ValueError as exc:
            raise TokenUnavailableError(f"etcd returned no revision: {exc}", resource=resource) from exc

    def grantor_id(self, *, timeout: float | None = None) -> str:
        """Return the cluster's grantor id, creating it on first use (see "Grantor identity").

        :raises TokenUnavailableError: no member answered within *timeout*.
        """
        return self._grantor.read(self._deadline(timeout), None)

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
        held = self._leases.acquire(resource, deadline)
        try:
            yield held
        finally:
            self._leases.release(held)

    def close(self) -> None:
        """Revoke held leases (best effort, bounded) and close connections. Idempotent."""
        if self._leases.close():
            self._gateway.close()

    def __enter__(self) -> EtcdTokenSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<EtcdTokenSource {','.join(self.endpoints)}{self.prefix}>"

    # Internal ------------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> float:
        seconds = self.timeout if timeout is None else validated_seconds("timeout", timeout)
        return time.monotonic() + seconds

    def _after_fork(self) -> None:
        # The gateway noticed a forked child: its locks and the parent's leases are the parent's.
        self._grantor.after_fork()
        self._leases.after_fork()
