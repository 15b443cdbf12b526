"""URLs in configuration: split, read their query parameters against an allow-list, and show them without a password.

One copy of each, used by every source, gate and command that takes a URL:
error messages and logs name a URL only through :func:`redact_url`, which never
returns a password, whether the URL is well formed or not.
"""

from __future__ import annotations

from urllib.parse import SplitResult, parse_qsl, urlsplit

from .exceptions import FencingConfigurationError
from .values import seconds

__all__ = ["parse_block", "parse_seconds", "query_params", "redact_url", "split_scheme_url", "split_url"]


def redact_url(url: object) -> str:
    """*url* with the password of its ``user:password@`` part replaced by ``***``, for messages and logs.

    Works on malformed URLs too (it never raises): everything between ``//``
    and the last ``@`` before the path is treated as credentials, so an
    unclosed ``[`` or a bad port cannot make it give the password back.
    """
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text
    end = len(rest)
    for stop in "/?#":
        index = rest.find(stop)
        if index != -1:
            end = min(end, index)
    netloc, tail = rest[:end], rest[end:]
    credentials, at, hosts = netloc.rpartition("@")
    if not at:
        return text
    user, colon, _ = credentials.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}@{hosts}{tail}"


def split_url(url: str, what: str = "URL") -> SplitResult:
    """``urlsplit(url)``, with its ``ValueError`` (an unclosed ``[``, say) as FencingConfigurationError.

    The message never repeats the URL: it may hold a password.
    """
    try:
        return urlsplit(url)
    except ValueError as exc:
        raise FencingConfigurationError(f"malformed {what}: {exc}") from None


def split_scheme_url(url: object, scheme: str, what: str) -> tuple[SplitResult, str]:
    """Check that *url* is a ``<scheme>://`` URL and split it; return the parts, and the URL as a message may show it.

    :raises FencingConfigurationError: *url* is no str, is malformed, or has another scheme.
    """
    if not isinstance(url, str):
        raise FencingConfigurationError(f"{what} must be a str, got {type(url).__name__}")
    shown = redact_url(url)
    parts = split_url(url, what)
    if parts.scheme.lower() != scheme:
        article = "an" if scheme[0] in "aeiou" else "a"
        raise FencingConfigurationError(f"not {article} {scheme}:// URL: {shown!r}")
    return parts, shown


def query_params(parts: SplitResult, allowed: set[str], *, what: str, shown: str) -> dict[str, str]:
    """The query parameters of a split URL, each named in *allowed*.

    *what* names the URL's kind in errors (``"etcd URL"``), *shown* is the URL
    as messages may show it (:func:`redact_url`'s).

    :raises FencingConfigurationError: a malformed query string, or a parameter
        outside *allowed* (the message lists what is accepted).
    """
    try:
        params = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query)))
    except ValueError as exc:
        raise FencingConfigurationError(f"malformed query string in {what} {shown!r}: {exc}") from None
    unknown = sorted(set(params) - allowed)
    if unknown:
        scheme = parts.scheme.lower()
        raise FencingConfigurationError(
            f"unknown parameter(s) {', '.join(unknown)} in {shown!r}; {scheme}:// accepts {', '.join(sorted(allowed))}"
        )
    return params


def parse_seconds(shown: str, name: str, raw: str) -> float:
    """A URL parameter that holds a positive, finite number of seconds.

    :raises FencingConfigurationError: naming the parameter, its value and the URL (as *shown*).
    """
    try:
        return seconds(name, raw, parse=True)
    except FencingConfigurationError:
        raise FencingConfigurationError(f"{name}={raw!r} in {shown!r} must be a positive number of seconds") from None


def parse_block(shown: str, raw: str) -> int:
    """The ``block=N`` parameter of a source URL: tokens per block, 1 (off) to ``2**SCALE_BITS``.

    :raises FencingConfigurationError: naming the value and the URL (as *shown*).
    """
    from .blocks import DEFAULT_BLOCK_SIZE

    if not raw.isdigit() or not 1 <= int(raw) <= DEFAULT_BLOCK_SIZE:
        raise FencingConfigurationError(
            f"block={raw!r:.20} in {shown!r} must be a whole number from 1 (no blocks) to {DEFAULT_BLOCK_SIZE}"
        )
    return int(raw)
