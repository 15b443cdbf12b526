"""Origin checks: gates that refuse tokens the grantor cannot have issued.

A gate trusts the number it is shown. A forged or corrupted token far above
every real one (a PostgreSQL probe accepted 2**63-1) becomes the mark, and
from then on every honest writer of that resource is refused. Two optional
verification modes stop such tokens at the gate, before any write; pass one
(or several, with :class:`AllOf`) as a gate's ``verifier=``.

**Signed mode** (:class:`TokenSigner`), for setups where minting is a service
apart from the workers: the service signs each token with HMAC-SHA256 over
the key id, grantor id, value and resource (``sign``, or wrap its source in
:class:`SigningTokenSource`); the gates hold the key(s) and refuse a token
that is unsigned, signed with an unknown key id, or whose signature does not
match (``hmac.compare_digest``, constant time). Several keys, each with an
id, allow rotation: sign with the new key while the gates accept both.

**Plausibility bound** (:class:`PlausibilityBound`), where there are no keys:
the gate asks the grantor (the worker's own source) how far it has counted,
and refuses a token above that plus a margin, or of another grantor. A
token at or below the last ceiling read plus the margin passes without I/O;
above it, the gate reads the ceiling again first, so an honest token (always
minted before it is shown) always passes. The margin only saves reads.

What each stops, and what it does not, is in the Security page of the docs;
in short: neither stops a holder of a valid token (a compromised worker)
from using it, nor a stolen key; the bound lets a token up to the margin
above the counter through.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn, Protocol

from .exceptions import (
    FencingConfigurationError,
    ForgedTokenError,
    GateUnavailableError,
    GrantorMismatchError,
    TokenUnavailableError,
)
from .protocols import TokenSource, TokenVerifier, TransientSource
from .token import FencingToken

__all__ = ["MIN_KEY_BYTES", "AllOf", "PlausibilityBound", "SigningTokenSource", "TokenSigner"]

#: Shortest signing key accepted, in bytes (HMAC-SHA256's own output size).
MIN_KEY_BYTES = 32

_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")
# A domain-separation prefix, so these MACs mean nothing in any other protocol that shares a key.
_CONTEXT = b"celery-fencing token v1"


def _message(key_id: str, token: FencingToken) -> bytes:
    # NUL cannot occur in any field: resources refuse control characters, and key
    # and grantor ids are a small ASCII alphabet. So the encoding is unambiguous.
    fields = (key_id, token.grantor or "", str(token.value), token.resource)
    return b"\0".join([_CONTEXT, *(field.encode("utf-8") for field in fields)])


class TokenSigner:
    """Signs tokens and verifies signatures with HMAC-SHA256, under named keys.

    :param keys: key id -> secret key (``bytes``, or ``str`` taken as UTF-8),
        each at least :data:`MIN_KEY_BYTES` long, e.g. ``secrets.token_hex(32)``.
        Key ids are 1-32 characters of ``A-Z a-z 0-9 . _ -``.
    :param current: the key id :meth:`sign` uses; may be omitted with one key.
    :raises FencingConfigurationError: no keys, a bad key id, a short key, or
        an unknown or ambiguous *current*.

    Thread-safe (immutable). ``repr()`` and every error name key ids, never keys.
    """

    def __init__(self, keys: Mapping[str, bytes | str], *, current: str | None = None) -> None:
        if not isinstance(keys, Mapping) or not keys:
            raise FencingConfigurationError("TokenSigner needs at least one key: {key id: secret}")
        self._keys: dict[str, bytes] = {}
        for key_id, key in keys.items():
            if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
                raise FencingConfigurationError(
                    f"signing key id must be 1-32 characters of A-Z a-z 0-9 . _ -, got {key_id!r:.40}"
                )
            secret = key.encode("utf-8") if isinstance(key, str) else key
            if not isinstance(secret, bytes) or len(secret) < MIN_KEY_BYTES:
                raise FencingConfigurationError(
                    f"signing key {key_id!r} must be at least {MIN_KEY_BYTES} bytes (e.g. secrets.token_hex(32))"
                )
            self._keys[key_id] = secret
        if current is None:
            if len(self._keys) != 1:
                raise FencingConfigurationError("with several signing keys, name the one to sign with: current=")
            current = next(iter(self._keys))
        if current not in self._keys:
            raise FencingConfigurationError(f"current={current!r} names none of the signing keys")
        self.current = current

    @property
    def key_ids(self) -> list[str]:
        """The key ids this signer verifies, sorted."""
        return sorted(self._keys)

    def sign(self, token: FencingToken) -> FencingToken:
        """Return *token* with a signature by the current key.

        :raises ForgedTokenError: the token names no grantor (the signature covers it).
        """
        if not isinstance(token, FencingToken):
            raise TypeError(f"sign() needs a FencingToken, not {type(token).__name__}")
        if token.grantor is None:
            raise ForgedTokenError(
                resource=token.resource, token=token.value, reason="a token without a grantor id cannot be signed"
            )
        mac = hmac.new(self._keys[self.current], _message(self.current, token), hashlib.sha256).hexdigest()
        return FencingToken(token.resource, token.value, token.grantor, f"{self.current}:{mac}")

    def verify(self, token: FencingToken) -> None:
        """Return if *token* carries a valid signature by one of the keys.

        :raises ForgedTokenError: unsigned, unknown key id, or the signature does not match.
        """
        signature = token.signature
        if signature is None:
            self._refuse(token, "it is not signed, and this gate accepts signed tokens only")
        key_id, _, mac = signature.partition(":")
        key = self._keys.get(key_id)
        if key is None:
            self._refuse(token, f"it is signed with key id {key_id!r}, which this gate does not have")
        expected = hmac.new(key, _message(key_id, token), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected.encode("ascii"), mac.encode("ascii")):
            self._refuse(token, f"its signature (key id {key_id!r}) does not match its grantor, value and resource")

    def _refuse(self, token: FencingToken, reason: str) -> NoReturn:
        raise ForgedTokenError(resource=token.resource, token=token.value, grantor=token.grantor, reason=reason)

    def __repr__(self) -> str:
        return f"TokenSigner(key_ids={self.key_ids!r}, current={self.current!r})"


class SigningTokenSource:
    """A token source whose tokens come signed: for the service that mints for others.

    ``mint``, ``mint_transient`` and ``mint_many`` sign what *source* mints;
    ``close``, ``grantor_id``, ``ceiling`` and the like are passed through.
    Exclusive leases are not offered (their tokens would go out unsigned): use
    them where the minter is also the writer.
    """

    def __init__(self, source: TokenSource, signer: TokenSigner) -> None:
        self.source = source
        self.signer = signer
        self.volatile = bool(getattr(source, "volatile", False))

    def mint(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        """Mint with the wrapped source and sign the token."""
        return self.signer.sign(self.source.mint(resource, timeout=timeout))

    def mint_transient(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        """Mint without per-resource state where the source can (see ``TokenSource``), and sign the token."""
        source = self.source
        mint = source.mint_transient if isinstance(source, TransientSource) else source.mint
        token = mint(resource, timeout=timeout)
        return self.signer.sign(token)

    def mint_many(self, resources: Iterable[str], *, timeout: float | None = None) -> list[FencingToken]:
        """Mint several (pipelined where the source can) and sign each."""
        many = getattr(self.source, "mint_many", None)
        names = list(resources)
        tokens = (
            many(names, timeout=timeout) if many is not None else [self.source.mint(n, timeout=timeout) for n in names]
        )
        return [self.signer.sign(token) for token in tokens]

    def close(self) -> None:
        self.source.close()

    def __getattr__(self, name: str) -> Any:
        # grantor_id, ceiling, connect, ...: the wrapped source's own. Never a way to
        # mint: a token minted past this wrapper would go out unsigned.
        if name.startswith("_") or name.startswith("mint") or name == "lease":
            raise AttributeError(name)
        return getattr(self.source, name)

    def __repr__(self) -> str:
        return f"SigningTokenSource({self.source!r}, {self.signer!r})"


class _BoundedSource(Protocol):
    def grantor_id(self, *, timeout: float | None = None) -> str: ...

    def ceiling(self, resource: str, *, timeout: float | None = None) -> int: ...


class PlausibilityBound:
    """Refuses tokens above what their grantor can have issued, or of another grantor.

    :param source: the grantor to ask: a source with ``grantor_id()`` and
        ``ceiling(resource)`` (ZooKeeper, etcd, SQLite, memory), usually the
        worker's own. Nothing is minted.
    :param margin: tokens up to ``ceiling + margin`` pass without asking the
        grantor again. A larger margin means fewer reads, and lets a forged
        token up to that far above the counter through (it then holds honest
        writers off until the grantor counts past it).
    :param timeout: bound on each read of the grantor.
    :raises FencingConfigurationError: a source that cannot be asked, or a bad margin.

    A token without a grantor id is refused: it cannot be bounded. Thread-safe.
    """

    def __init__(self, source: Any, *, margin: int = 1000, timeout: float | None = None) -> None:
        for method in ("grantor_id", "ceiling"):
            if not callable(getattr(source, method, None)):
                raise FencingConfigurationError(f"PlausibilityBound needs a source with {method}(), not {source!r:.80}")
        if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
            raise FencingConfigurationError(f"margin must be an int >= 0, got {margin!r}")
        self.source: _BoundedSource = source
        self.margin = margin
        self.timeout = timeout
        self._global = bool(getattr(source, "ceiling_is_global", False))
        self._lock = threading.Lock()
        self._grantor: str | None = None
        self._ceiling: int | None = None  # for a global counter: the highest ceiling read

    def verify(self, token: FencingToken) -> None:
        """Return if *token* is of the source's grantor and not above its counter plus the margin.

        :raises ForgedTokenError: no grantor id, or a value the grantor cannot have issued.
        :raises GrantorMismatchError: a token of another grantor than the source's.
        :raises GateUnavailableError: the grantor could not be asked in time.
        """
        if token.grantor is None:
            raise ForgedTokenError(
                resource=token.resource,
                token=token.value,
                reason="it names no grantor, so its value cannot be bounded (minted by an older version?)",
            )
        grantor = self._grantor or self._read_grantor()
        if token.grantor != grantor:
            grantor = self._read_grantor()  # it may have changed (a rebase) since it was read
            if token.grantor != grantor:
                raise GrantorMismatchError(
                    resource=token.resource, token_grantor=token.grantor, expected_grantor=grantor
                )
        known = self._ceiling
        if self._global and known is not None and token.value <= known + self.margin:
            return
        ceiling = self._read_ceiling(token.resource)
        if token.value > ceiling + self.margin:
            raise ForgedTokenError(
                resource=token.resource,
                token=token.value,
                grantor=token.grantor,
                reason=f"its value is above anything grantor {token.grantor} has issued "
                f"(its counter is at {ceiling}, margin {self.margin})",
            )

    def _read_grantor(self) -> str:
        try:
            grantor = self.source.grantor_id(timeout=self.timeout)
        except TokenUnavailableError as exc:
            raise GateUnavailableError(f"cannot ask the grantor for its id: {exc}", gate="PlausibilityBound") from exc
        with self._lock:
            if grantor != self._grantor:
                self._grantor, self._ceiling = grantor, None
        return grantor

    def _read_ceiling(self, resource: str) -> int:
        try:
            ceiling = int(self.source.ceiling(resource, timeout=self.timeout))
        except TokenUnavailableError as exc:
            raise GateUnavailableError(
                f"cannot ask the grantor how far it counted: {exc}", gate="PlausibilityBound"
            ) from exc
        if self._global:
            with self._lock:
                self._ceiling = ceiling if self._ceiling is None else max(self._ceiling, ceiling)
        return ceiling

    def __repr__(self) -> str:
        return f"PlausibilityBound({self.source!r}, margin={self.margin})"


class AllOf:
    """Several verifiers, all of which must pass, in order: ``AllOf(signer, bound)``."""

    def __init__(self, *verifiers: TokenVerifier) -> None:
        if not verifiers:
            raise FencingConfigurationError("AllOf needs at least one verifier")
        self.verifiers = verifiers

    def verify(self, token: FencingToken) -> None:
        """Run every verifier; the first to refuse raises."""
        for verifier in self.verifiers:
            verifier.verify(token)

    def __repr__(self) -> str:
        return f"AllOf{self.verifiers!r}"
