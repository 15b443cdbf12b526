"""Znode names: resources as single, reversible znode names, and the layout under the root.

Pure functions of strings, with no ZooKeeper call. A name that cannot be a
resource raises :class:`~celery_fencing.InvalidTokenError` before anything is
sent; nothing else here raises.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from ...exceptions import InvalidTokenError
from ...token import MAX_RESOURCE_LENGTH, validate_resource

__all__ = [
    "LEASE_MARKER",
    "MAX_ZNODE_NAME_LENGTH",
    "Layout",
    "lease_sequence",
    "lock_prefix",
    "resource_to_znode_name",
    "znode_name_to_resource",
]

#: Longest znode name a resource maps to: every character percent-encoded as
#: up to 4 UTF-8 bytes of 3 characters each. Far below ZooKeeper's 1 MB packet limit.
MAX_ZNODE_NAME_LENGTH = 12 * MAX_RESOURCE_LENGTH

# Besides letters, digits and "_.-~" (always kept by quote): readable separators
# that are plain characters in a znode name.
_KEPT = ":@+=,!"
# "." and ".." are not valid path components, and "zookeeper" is reserved at the
# top level; our names never sit at the top, but refusing it everywhere is simpler.
_RESERVED = frozenset({".", "..", "zookeeper"})
#: Between a lock node's unique prefix and the sequence number ZooKeeper appends.
LEASE_MARKER = "-lease-"


def resource_to_znode_name(resource: str) -> str:
    """Map a resource name to a single, valid znode name, reversibly.

    Percent-encodes ``/``, ``%``, spaces, every non-ASCII character (as UTF-8)
    and everything else outside a small safe set; ``.``, ``..`` and
    ``zookeeper`` get their first character encoded. The result is at most
    :data:`MAX_ZNODE_NAME_LENGTH` characters.

    :raises InvalidTokenError: *resource* is not a valid resource name.
    """
    name = quote(validate_resource(resource), safe=_KEPT)
    if name in _RESERVED:
        name = f"%{ord(name[0]):02X}{name[1:]}"
    return name


def znode_name_to_resource(name: str) -> str:
    """Invert :func:`resource_to_znode_name`.

    :raises InvalidTokenError: *name* is not a name that function produces.
    """
    try:
        resource = unquote(name, errors="strict")
    except UnicodeDecodeError as exc:
        raise InvalidTokenError(f"znode name {name!r:.80} is not a percent-encoded resource: {exc}") from exc
    if resource_to_znode_name(resource) != name:
        raise InvalidTokenError(f"znode name {name!r:.80} is not in the canonical encoding of a resource")
    return resource


def lease_sequence(name: str) -> int | None:
    """The queue position ZooKeeper gave a lock node, ``None`` for a name that is not a lock node's."""
    head, marker, digits = name.rpartition(LEASE_MARKER)
    if not marker or not head:
        return None
    try:
        return int(digits)
    except ValueError:
        return None


def lock_prefix(name: str) -> str:
    """The unique prefix of a lock node's name, which finds the node again whatever its sequence number."""
    return name[: name.rindex(LEASE_MARKER) + len(LEASE_MARKER)]


class Layout:
    """Where everything lives under the root znode (already validated)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.tokens = f"{root}/tokens"
        self.locks = f"{root}/locks"
        self.transient = f"{root}/transient"
        self.grantor = f"{root}/grantor"
        self.scale = f"{root}/token-scale"
        self.clock = f"{root}/clock"

    def token(self, resource: str) -> str:
        return f"{self.tokens}/{resource_to_znode_name(resource)}"

    def lock_dir(self, resource: str) -> str:
        return f"{self.locks}/{resource_to_znode_name(resource)}"

    def holder(self, resource: str) -> str:
        return f"{self.root}/holders/{resource_to_znode_name(resource)}"
