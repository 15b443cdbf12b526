"""The fencing token: a resource name and a strictly increasing number.

A token is minted by a grantor (ZooKeeper, SQLite), never by a client, and is
ordered only against tokens of the same resource: ZooKeeper zxids are global,
so comparing tokens of two resources would mean nothing.

Tokens are immutable and validated on construction. ``to_header()`` and
``from_header()`` give the wire form carried in Celery message headers; the
parser accepts only what ``to_header()`` produces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .exceptions import InvalidTokenError, ResourceMismatchError

__all__ = [
    "MAX_RESOURCE_LENGTH",
    "MAX_TOKEN_VALUE",
    "FencingToken",
    "fixed_width",
    "validate_resource",
    "validate_token_value",
]

#: The largest token value: tokens live in a signed 64-bit column (SQL BIGINT).
MAX_TOKEN_VALUE = 2**63 - 1
#: Longest resource name, in characters. Keeps znode names, Redis keys and SQL
#: primary keys within every backend's limits.
MAX_RESOURCE_LENGTH = 200

_HEADER_VERSION = "1"
_HEADER_MAX_LENGTH = len(_HEADER_VERSION) + 2 + len(str(MAX_TOKEN_VALUE)) + MAX_RESOURCE_LENGTH * 4
_DIGITS = re.compile(r"[1-9][0-9]{0,18}")


def validate_token_value(value: object) -> int:
    """Return *value* as an ``int`` if it is a valid token value, else raise.

    A valid value is an ``int`` (``bool`` is refused, as are floats and
    strings, even ``"35"``: the probes showed PostgreSQL silently rounding a
    float token and casting a string) with ``1 <= value <= MAX_TOKEN_VALUE``.

    :raises InvalidTokenError: naming what is wrong.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTokenError(f"token value must be an int, not {type(value).__name__}: {value!r:.60}")
    value = int(value)
    if value < 1:
        raise InvalidTokenError(f"token value must be >= 1, got {value}")
    if value > MAX_TOKEN_VALUE:
        raise InvalidTokenError(f"token value must be < 2**63, got {value}")
    return value


def validate_resource(resource: object) -> str:
    """Return *resource* if it is a valid resource name, else raise.

    A resource is a non-empty ``str`` of at most ``MAX_RESOURCE_LENGTH``
    characters, encodable as UTF-8, with no control characters.

    :raises InvalidTokenError: naming what is wrong.
    """
    if not isinstance(resource, str):
        raise InvalidTokenError(f"resource must be a str, not {type(resource).__name__}")
    if not resource:
        raise InvalidTokenError("resource must not be empty")
    if len(resource) > MAX_RESOURCE_LENGTH:
        raise InvalidTokenError(f"resource is {len(resource)} characters long; the limit is {MAX_RESOURCE_LENGTH}")
    for char in resource:
        code = ord(char)
        if code < 0x20 or 0x7F <= code < 0xA0:
            raise InvalidTokenError(f"resource {resource!r} contains the control character {char!r}")
        if 0xD800 <= code < 0xE000:
            raise InvalidTokenError(f"resource {resource!r} contains a lone surrogate")
    return resource


def fixed_width(value: int) -> str:
    """Return a token value as 20 decimal digits, zero-padded.

    Stores that cannot compare 64-bit integers exactly (Lua numbers are doubles,
    exact only below 2**53) compare these strings instead: for equal widths,
    string order is numeric order.
    """
    return f"{validate_token_value(value):020d}"


@dataclass(frozen=True, eq=True, order=False, slots=True)
class FencingToken:
    """A fencing token: ``value`` was minted by the grantor for ``resource``.

    Tokens of the same resource compare by value. Comparing tokens of
    different resources raises :class:`ResourceMismatchError` (equality is
    allowed and is simply ``False``).

    :raises InvalidTokenError: on construction, for a bad resource or value.
    """

    resource: str
    value: int

    def __post_init__(self) -> None:
        validate_resource(self.resource)
        object.__setattr__(self, "value", validate_token_value(self.value))

    # Ordering ------------------------------------------------------------------

    def _comparable(self, other: object) -> FencingToken:
        if not isinstance(other, FencingToken):
            raise TypeError(f"cannot compare FencingToken with {type(other).__name__}")
        if other.resource != self.resource:
            raise ResourceMismatchError(
                f"tokens of different resources are not ordered: {self.resource!r} and {other.resource!r}",
                token_resource=other.resource,
                expected_resource=self.resource,
            )
        return other

    def __lt__(self, other: object) -> bool:
        return self.value < self._comparable(other).value

    def __le__(self, other: object) -> bool:
        return self.value <= self._comparable(other).value

    def __gt__(self, other: object) -> bool:
        return self.value > self._comparable(other).value

    def __ge__(self, other: object) -> bool:
        return self.value >= self._comparable(other).value

    # Wire form -----------------------------------------------------------------

    def to_header(self) -> str:
        """Return the wire form, ``"1:<value>:<resource>"``."""
        return f"{_HEADER_VERSION}:{self.value}:{self.resource}"

    @classmethod
    def from_header(cls, header: Any) -> FencingToken:
        """Parse the wire form made by :meth:`to_header`.

        :raises InvalidTokenError: for anything else (wrong type, oversized,
            unknown version, a value with a sign, spaces or leading zeros, a bad
            resource).
        """
        if not isinstance(header, str):
            raise InvalidTokenError(f"token header must be a str, not {type(header).__name__}")
        if len(header) > _HEADER_MAX_LENGTH:
            raise InvalidTokenError(f"token header is {len(header)} characters long; the limit is {_HEADER_MAX_LENGTH}")
        parts = header.split(":", 2)
        if len(parts) != 3:
            raise InvalidTokenError(f"malformed token header {header!r:.80}: expected '1:<value>:<resource>'")
        version, digits, resource = parts
        if version != _HEADER_VERSION:
            raise InvalidTokenError(f"unknown token header version {version!r:.20}")
        if not _DIGITS.fullmatch(digits):
            raise InvalidTokenError(f"malformed token value {digits!r:.40} in header")
        return cls(resource, int(digits))

    def __repr__(self) -> str:
        return f"FencingToken({self.resource!r}, {self.value})"
