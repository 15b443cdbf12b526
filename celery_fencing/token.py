"""The fencing token: a resource name and a strictly increasing number.

A token is minted by a grantor (ZooKeeper, SQLite), never by a client, and is
ordered only against tokens of the same resource: ZooKeeper zxids are global,
so comparing tokens of two resources would mean nothing. It is also ordered
only against tokens of the same *grantor*: every source has an identity (a
random id stored once in ZooKeeper, in the SQLite file, under the etcd
prefix), and a grantor that was wiped and started again has a new one, so
its tokens, which count from the start again, are never compared with the
old grantor's.

Tokens are immutable and validated on construction. ``to_header()`` and
``from_header()`` give the wire form; the parser accepts only what
``to_header()`` produces:

=============================================================  ======================
``1:<value>:<resource>``                                       no grantor (older minters)
``2:<grantor>:<value>:<resource>``                             with the grantor's id
``3:<grantor>:<value>:<key id>:<hmac hex>:<resource>``         signed (:mod:`.signing`)
=============================================================  ======================

The resource comes last because it may contain colons; grantor ids and key
ids may not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .exceptions import GrantorMismatchError, InvalidTokenError, ResourceMismatchError

__all__ = [
    "MAX_GRANTOR_LENGTH",
    "MAX_RESOURCE_LENGTH",
    "MAX_TOKEN_VALUE",
    "FencingToken",
    "Mark",
    "check_grantor",
    "fixed_width",
    "validate_grantor",
    "validate_resource",
    "validate_signature",
    "validate_token_value",
]

#: The largest token value: tokens live in a signed 64-bit column (SQL BIGINT).
MAX_TOKEN_VALUE = 2**63 - 1
#: Longest resource name, in characters. Keeps znode names, Redis keys and SQL
#: primary keys within every backend's limits.
MAX_RESOURCE_LENGTH = 200

#: Longest grantor id, in characters.
MAX_GRANTOR_LENGTH = 64

# Grantor ids and key ids go into keys, SQL columns and the colon-separated
# header: a small, colon-free alphabet.
_GRANTOR = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")
_MAC = re.compile(r"[0-9a-f]{64}")
_HEADER_MAX_LENGTH = 3 + MAX_GRANTOR_LENGTH + 1 + 19 + 1 + 32 + 1 + 64 + 1 + MAX_RESOURCE_LENGTH * 4
_DIGITS = re.compile(r"[1-9][0-9]{0,18}")
# C0 controls, DEL and C1 controls, and lone surrogates (not encodable as UTF-8).
_FORBIDDEN_IN_RESOURCE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


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
    # One regex scan (every task validates its resource a few times: a loop over
    # the characters cost 20 us per task for a task id); the loop only names the culprit.
    if _FORBIDDEN_IN_RESOURCE.search(resource):
        for char in resource:
            code = ord(char)
            if code < 0x20 or 0x7F <= code < 0xA0:
                raise InvalidTokenError(f"resource {resource!r} contains the control character {char!r}")
            if 0xD800 <= code < 0xE000:
                raise InvalidTokenError(f"resource {resource!r} contains a lone surrogate")
    return resource


def validate_grantor(grantor: object) -> str | None:
    """Return *grantor* if it is ``None`` or a valid grantor id, else raise.

    A grantor id is 1 to ``MAX_GRANTOR_LENGTH`` characters of ``A-Z a-z 0-9 . _ -``,
    starting with a letter or digit (no colon: it goes into the header).

    :raises InvalidTokenError: naming what is wrong.
    """
    if grantor is None:
        return None
    if not isinstance(grantor, str) or not _GRANTOR.fullmatch(grantor):
        raise InvalidTokenError(
            f"grantor id must be 1-{MAX_GRANTOR_LENGTH} characters of A-Z a-z 0-9 . _ - "
            f"(starting with a letter or digit), got {grantor!r:.80}"
        )
    return grantor


def validate_signature(signature: object) -> str | None:
    """Return *signature* if it is ``None`` or ``"<key id>:<64 lowercase hex digits>"``, else raise.

    Only the form is checked here; whether it is right is for :mod:`celery_fencing.signing`.

    :raises InvalidTokenError: naming what is wrong.
    """
    if signature is None:
        return None
    if isinstance(signature, str):
        key_id, sep, mac = signature.partition(":")
        if sep and _KEY_ID.fullmatch(key_id) and _MAC.fullmatch(mac):
            return signature
    raise InvalidTokenError(f"signature must be '<key id>:<64 hex digits>', got {signature!r:.100}")


def fixed_width(value: int) -> str:
    """Return a token value as 20 decimal digits, zero-padded.

    Stores that cannot compare 64-bit integers exactly (Lua numbers are doubles,
    exact only below 2**53) compare these strings instead: for equal widths,
    string order is numeric order.
    """
    return f"{validate_token_value(value):020d}"


@dataclass(frozen=True, eq=True, order=False, slots=True)
class FencingToken:
    """A fencing token: ``value`` was minted by ``grantor`` for ``resource``.

    Tokens of the same resource and grantor compare by value. Comparing tokens
    of different resources raises :class:`ResourceMismatchError`, of
    different grantors :class:`GrantorMismatchError` (equality is allowed
    and is simply ``False``). A token without a grantor (``None``: minted by
    an older version, or a source that has no identity) orders by value
    against any grantor's, as every token did before grantors existed.

    ``signature`` (``"<key id>:<hmac hex>"``) is set only in signed mode
    (:class:`~celery_fencing.signing.TokenSigner`); it is not part of equality.

    :raises InvalidTokenError: on construction, for a bad resource, value,
        grantor id or signature form.
    """

    resource: str
    value: int
    grantor: str | None = None
    signature: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        validate_resource(self.resource)
        object.__setattr__(self, "value", validate_token_value(self.value))
        validate_grantor(self.grantor)
        validate_signature(self.signature)
        if self.signature is not None and self.grantor is None:
            raise InvalidTokenError("a signed token must name its grantor: the signature covers the grantor id")

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
        if self.grantor is not None and other.grantor is not None and other.grantor != self.grantor:
            raise GrantorMismatchError(
                f"tokens of different grantors are not ordered: {self.grantor!r} and {other.grantor!r} "
                f"(resource {self.resource!r})",
                resource=self.resource,
                token_grantor=other.grantor,
                expected_grantor=self.grantor,
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
        """Return the wire form: version 1 without a grantor, 2 with one, 3 when signed."""
        if self.grantor is None:
            return f"1:{self.value}:{self.resource}"
        if self.signature is None:
            return f"2:{self.grantor}:{self.value}:{self.resource}"
        return f"3:{self.grantor}:{self.value}:{self.signature}:{self.resource}"

    @classmethod
    def from_header(cls, header: Any) -> FencingToken:
        """Parse the wire form made by :meth:`to_header` (versions 1, 2 and 3).

        :raises InvalidTokenError: for anything else (wrong type, oversized,
            unknown version, a value with a sign, spaces or leading zeros, a bad
            grantor id, signature or resource).
        """
        if not isinstance(header, str):
            raise InvalidTokenError(f"token header must be a str, not {type(header).__name__}")
        if len(header) > _HEADER_MAX_LENGTH:
            raise InvalidTokenError(f"token header is {len(header)} characters long; the limit is {_HEADER_MAX_LENGTH}")
        version, _, rest = header.partition(":")
        fields = {"1": 2, "2": 3, "3": 5}.get(version)
        if fields is None:
            raise InvalidTokenError(f"unknown token header version {version!r:.20}")
        parts = rest.split(":", fields - 1)
        if len(parts) != fields:
            raise InvalidTokenError(f"malformed version {version} token header {header!r:.80}")
        grantor = signature = None
        if version == "1":
            digits, resource = parts
        elif version == "2":
            grantor, digits, resource = parts
        else:
            grantor, digits, key_id, mac, resource = parts
            signature = f"{key_id}:{mac}"
        if not _DIGITS.fullmatch(digits):
            raise InvalidTokenError(f"malformed token value {digits!r:.40} in header")
        if grantor is not None and not grantor:
            raise InvalidTokenError("empty grantor id in token header")
        return cls(resource, int(digits), grantor, signature)

    def __repr__(self) -> str:
        extra = "" if self.grantor is None else f", grantor={self.grantor!r}"
        if self.signature is not None:
            extra += f", signed={self.signature.partition(':')[0]!r}"
        return f"FencingToken({self.resource!r}, {self.value}{extra})"


@dataclass(frozen=True, slots=True)
class Mark:
    """A resource's high-water mark as a gate stores it: the value and the grantor it belongs to.

    ``grantor`` is ``None`` for a mark written only by tokens without a
    grantor (or by a version of this library before grantor ids); the first
    token with a grantor that passes the mark gives it that grantor.
    """

    resource: str
    value: int
    grantor: str | None = None


def check_grantor(token: FencingToken, stored: str | None) -> None:
    """Raise :class:`GrantorMismatchError` if *token* and a mark's grantor *stored* are both known and differ.

    A mark without a grantor adopts the first grantor that passes it; a token
    without a grantor is checked by value only (see :class:`FencingToken`).
    """
    if stored is not None and token.grantor is not None and token.grantor != stored:
        raise GrantorMismatchError(resource=token.resource, token_grantor=token.grantor, expected_grantor=stored)
