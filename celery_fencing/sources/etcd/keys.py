"""Resource names as etcd key names, and where a source's keys live under its prefix.

``<prefix>/tokens/<name>`` (the token key, one put per mint),
``<prefix>/locks/<name>`` (etcd's lock in exclusive mode; the lock key is
``<name>/<lease id>``) and ``<prefix>/grantor`` (the grantor id). The gateway
takes keys and values in base64.
"""

from __future__ import annotations

import base64
from urllib.parse import quote

from ...token import validate_resource

__all__ = ["Keys", "b64", "resource_to_key_name"]

# Kept readable in keys besides letters, digits and "_.-~"; "/" is always encoded,
# so the lock prefix "<name>/" of one resource never covers another resource.
_KEPT = ":@+=,!"


def resource_to_key_name(resource: str) -> str:
    """Map a resource name to the last component of its etcd keys, reversibly (percent-encoding).

    :raises InvalidTokenError: *resource* is not a valid resource name.
    """
    return quote(validate_resource(resource), safe=_KEPT)


def b64(text: str) -> str:
    """*text* as the gateway takes keys and values: its UTF-8 bytes in base64."""
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


class Keys:
    """The keys of one source, under its prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        #: The key holding the cluster's grantor id.
        self.grantor = f"{prefix}/grantor"

    def token(self, resource: str) -> str:
        """The key whose puts mint *resource*'s tokens."""
        return f"{self.prefix}/tokens/{resource_to_key_name(resource)}"

    def lock(self, resource: str) -> str:
        """The name of etcd's lock on *resource* (its lock keys are this, a slash, and a lease id)."""
        return f"{self.prefix}/locks/{resource_to_key_name(resource)}"
