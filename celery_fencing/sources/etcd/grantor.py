"""The cluster's grantor id, and the token a put's revision makes (above every token minted before).

The first source to reach a cluster stores a random id under
``<prefix>/grantor`` with a transaction that puts it only if the key was never
created; every mint compares it in its own transaction (:meth:`Grantor.compare`),
so a token never carries the id of data it was not minted from. A revision
that is not above every token this source minted before the mint was sent is
refused: revisions go backwards only when the cluster's state was replaced.
"""

from __future__ import annotations

import base64
import logging
import threading
import uuid
from typing import Any

from ...exceptions import InvalidTokenError, TokenUnavailableError
from ...token import FencingToken, validate_grantor, validate_token_value
from .gateway import Gateway, int_field
from .keys import Keys, b64

__all__ = ["Grantor"]

# One logger for the whole package, named as the module was before it became one.
log = logging.getLogger(__package__)


class Grantor:
    """The grantor id of one source's cluster (read once, then cached) and the floor of its tokens. Thread-safe."""

    def __init__(self, gateway: Gateway, keys: Keys) -> None:
        self._gateway = gateway
        self._keys = keys
        # Guards floor and the cached id; never held across a request.
        self._lock = threading.Lock()
        #: The highest token this source handed out: a later mint must exceed it.
        self.floor = 0
        # The cluster's grantor id, once read (every mint re-checks it in its transaction).
        self._id: str | None = None

    def after_fork(self) -> None:
        """In a forked child: a lock the parent's threads held stays held; take a new one."""
        self._lock = threading.Lock()

    def current(self, deadline: float, resource: str | None) -> str:
        """The grantor id: the one read before, or read (or created) now."""
        return self._id or self.read(deadline, resource)

    def compare(self, grantor: str) -> dict[str, Any]:
        """The transaction comparison "the grantor key still holds *grantor*"."""
        return {"key": b64(self._keys.grantor), "target": "VALUE", "result": "EQUAL", "value": b64(grantor)}

    def read(self, deadline: float, resource: str | None) -> str:
        """Read the grantor id, or store a new one if the key was never created; cache it."""
        key = b64(self._keys.grantor)
        candidate = f"etcd-{uuid.uuid4().hex}"
        reply = self._gateway.call(
            "/v3/kv/txn",
            {
                "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
                "success": [{"request_put": {"key": key, "value": b64(candidate)}}],
                "failure": [{"request_range": {"key": key}}],
            },
            deadline,
            resource,
            what="txn [create grantor id]",
        )
        if reply.get("succeeded"):
            grantor = candidate
            log.warning(
                "etcd %s%s had no grantor id: created %s", ",".join(self._gateway.endpoints), self._keys.prefix, grantor
            )
        else:
            try:
                (response,) = reply["responses"]
                (kv,) = response["response_range"]["kvs"]
                grantor = validate_grantor(base64.b64decode(kv.get("value", "")).decode("ascii")) or ""
            except (KeyError, TypeError, ValueError, InvalidTokenError) as exc:
                raise TokenUnavailableError(
                    f"{self._keys.grantor} does not hold a grantor id: {exc!r:.200}", resource=resource
                ) from exc
        with self._lock:
            self._id = grantor
        return grantor

    def token_from(self, resource: str, reply: dict[str, Any], floor: int, grantor: str) -> FencingToken:
        """The token of the put that *reply* answers, if above *floor* (the floor when the mint was sent).

        :raises TokenUnavailableError: the revision is unusable, or not above *floor*.
        """
        try:
            revision = int_field(reply.get("header") or {}, "revision")
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
            self.floor = max(self.floor, token.value)
        return token
