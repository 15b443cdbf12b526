"""Exclusive mode: etcd's lock on a resource, held by an etcd lease, and the tokens minted under it.

Taking a lease grants an etcd lease (``lease_ttl`` seconds, kept alive by a
thread of the lease), takes etcd's lock on ``<prefix>/locks/<name>`` with it
(``/v3/lock/lock``: the lock key is ``<name>/<lease id>``, deleted when the
lease ends), and mints in one transaction ``IF create_revision(lock key) ==
ours AND value(grantor key) == ours THEN put(token key)``: a holder whose lock
key is gone (lease expired, revoked, key deleted) can never mint. The lock is
for efficiency; the token stays the safety.
"""

from __future__ import annotations

import base64
import logging
import math
import threading
import time
from collections.abc import Callable

from ...exceptions import LeaseLostError, TokenUnavailableError
from ...lease_state import LeaseState
from ...token import FencingToken
from .gateway import Gateway, int_field
from .grantor import Grantor
from .keys import Keys, b64

__all__ = ["EtcdLease", "Leases"]

# One logger for the whole package, named as the module was before it became one.
log = logging.getLogger(__package__)


class EtcdLease(LeaseState):
    """An exclusive hold on a resource through etcd's lock, and the token minted under it.

    Obtained from :meth:`EtcdTokenSource.lease`. The lease is *lost* when
    its etcd lease expires or cannot be renewed within its TTL, when the lock
    key disappears, or when the source closes; ``lost`` then stays true and
    callbacks registered with :meth:`on_lost` run once, each in a short-lived
    thread. Thread-safe; lost in a forked child.
    """

    _log = log

    def __init__(self, leases: Leases, resource: str, lease_id: int, ttl: float) -> None:
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
        self._leases = leases
        self._keeper: threading.Thread | None = None

    def mint(self, *, timeout: float | None = None) -> FencingToken:
        """Mint a new, larger token under the lock, with the same transaction check.

        :raises LeaseLostError: the lease is lost, or etcd found the lock key gone.
        :raises TokenUnavailableError: etcd did not answer within *timeout*.
        """
        self.check()
        token = self._leases.mint_locked(self, self._leases.deadline(timeout))
        self._token = token
        return token

    # Internal -----------------------------------------------------------------

    def _keep_alive(self) -> None:
        """Renew the etcd lease every third of its TTL; mark the lease lost when that fails for a TTL."""
        gateway = self._leases.gateway
        renewed = time.monotonic()
        interval = self.ttl / 3
        while not self._released.wait(interval):
            if self._lost.is_set() or gateway.closed:
                return
            try:
                deadline = time.monotonic() + interval
                reply = gateway.call("/v3/lease/keepalive", {"ID": str(self.lease_id)}, deadline, self.resource)
                result = reply.get("result", reply)
                if int_field(result, "TTL", 0) <= 0:
                    self._mark_lost("the etcd lease expired")
                    return
                if self.lock_key is not None:
                    found = gateway.call(
                        "/v3/kv/range",
                        {"key": b64(self.lock_key), "count_only": True},
                        deadline,
                        self.resource,
                    )
                    if int_field(found, "count", 0) == 0:
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


class Leases:
    """The exclusive leases of one source: taking them, minting under them, releasing them. Thread-safe.

    :param deadline: turns a call's ``timeout`` (``None``: the source's) into a deadline.
    """

    def __init__(
        self,
        gateway: Gateway,
        keys: Keys,
        grantor: Grantor,
        *,
        lease_ttl: float,
        deadline: Callable[[float | None], float],
    ) -> None:
        self.gateway = gateway
        self.deadline = deadline
        self._keys = keys
        self._grantor = grantor
        self._lease_ttl = lease_ttl
        # Guards _held; never held across a request.
        self._lock = threading.Lock()
        self._held: set[EtcdLease] = set()

    def after_fork(self) -> None:
        """In a forked child: the leases taken in the parent are the parent's, and lost here."""
        self._lock = threading.Lock()
        leases, self._held = self._held, set()
        for held in leases:
            held._lost_reason = held._lost_reason or "the process forked"
            held._lost.set()

    def close(self) -> bool:
        """Mark every held lease lost and revoke it (bounded); ``False`` when the source was closed already."""
        with self._lock:
            if self.gateway.closed:
                return False
            leases, self._held = list(self._held), set()
        for held in leases:
            held._mark_lost("the token source was closed")
            self.revoke(held.lease_id, wait=True)
        return True

    def acquire(self, resource: str, deadline: float) -> EtcdLease:
        """Grant an etcd lease, take the lock with it and mint under it, by *deadline*.

        :raises TokenUnavailableError: not done by *deadline*, or etcd refused; no lock is left behind.
        """
        grantor = self._grantor.current(deadline, resource)
        granted = self.gateway.call(
            "/v3/lease/grant", {"TTL": math.ceil(self._lease_ttl)}, deadline, resource, what="grant"
        )
        try:
            lease_id = int_field(granted, "ID")
        except ValueError as exc:
            raise TokenUnavailableError(f"etcd granted no lease: {exc}", resource=resource) from exc
        held = EtcdLease(self, resource, lease_id, self._lease_ttl)
        held.grantor = grantor
        with self._lock:
            self._held.add(held)
        try:
            # The keeper renews from now on: waiting for the lock may take longer than the TTL.
            held._keeper = threading.Thread(
                target=held._keep_alive, name=f"fencing-etcd-keepalive:{resource}", daemon=True
            )
            held._keeper.start()
            try:
                locked = self.gateway.call(
                    "/v3/lock/lock",
                    {"name": b64(self._keys.lock(resource)), "lease": str(lease_id)},
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
            found = self.gateway.call("/v3/kv/range", {"key": b64(lock_key)}, deadline, resource, what="range")
            kvs = found.get("kvs") or []
            if not kvs:
                raise TokenUnavailableError(f"the lock key of {resource!r} vanished right after locking")
            held.lock_key = lock_key
            held.lock_revision = int_field(kvs[0], "create_revision")
            if held.lost:
                raise TokenUnavailableError(f"lease on {resource!r} was lost while being taken: {held.lost_reason}")
            try:
                held._token = self.mint_locked(held, deadline)
            except LeaseLostError as exc:
                raise TokenUnavailableError(f"lease on {resource!r} was lost while being taken: {exc}") from exc
        except BaseException as exc:
            self.release(held, wait=False)
            if isinstance(exc, ValueError):
                raise TokenUnavailableError(f"malformed etcd lock reply: {exc}", resource=resource) from exc
            raise
        return held

    def mint_locked(self, held: EtcdLease, deadline: float) -> FencingToken:
        """Mint with ``IF create_revision(lock key) == ours AND value(grantor key) == ours THEN put(token key)``."""
        resource = held.resource
        assert held.lock_key is not None
        floor = self._grantor.floor
        reply = self.gateway.call(
            "/v3/kv/txn",
            {
                "compare": [
                    {
                        "key": b64(held.lock_key),
                        "target": "CREATE",
                        "result": "EQUAL",
                        "create_revision": str(held.lock_revision),
                    },
                    self._grantor.compare(held.grantor),
                ],
                "success": [{"request_put": {"key": b64(self._keys.token(resource)), "value": ""}}],
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
        return self._grantor.token_from(resource, reply, floor, held.grantor)

    def release(self, held: EtcdLease, *, wait: bool = True) -> None:
        """Forget *held* and revoke its etcd lease (which deletes the lock key); never raises for a lost lease."""
        with self._lock:
            self._held.discard(held)
        held._mark_released()
        if self.gateway.forked() or self.gateway.closed:
            return
        self.revoke(held.lease_id, wait=wait)

    def revoke(self, lease_id: int, *, wait: bool) -> None:
        """Revoke the etcd lease *lease_id*, now or in a thread of its own; failures are logged."""

        # Revoking deletes the lock key at once; if it fails, the key goes when the TTL runs out.
        def revoke() -> None:
            try:
                self.gateway.call("/v3/lease/revoke", {"ID": str(lease_id)}, self.deadline(None), None, what="revoke")
            except TokenUnavailableError as exc:
                log.info("could not revoke etcd lease %x (it expires by itself): %s", lease_id, exc)

        if wait:
            revoke()
        else:
            threading.Thread(target=revoke, name="fencing-etcd-revoke", daemon=True).start()
