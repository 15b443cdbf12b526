"""Conditional writes to HTTP resources that support ETags: ``If-Match``, and ``412`` when it no longer does.

An HTTP service cannot check a fencing token, but many can refuse a write
that was based on an outdated read: the server gives each version of a
resource an ETag, the client sends the ETag it read in ``If-Match``, and the
server answers ``412 Precondition Failed`` when the resource changed since.
That is a compare-and-set at the sink, which is what a gate needs::

    t=0   A (token 7) GETs the document: {"total": 100}, ETag "v1"; A pauses
    t=1   B (token 9) GETs it (ETag "v1"), PUTs {"total": 120} If-Match "v1": 200, ETag "v2"
    t=5   A resumes, PUTs {"total": 110} If-Match "v1": 412 Precondition Failed,
          nothing written; A gets StaleETagError, and its task's on-stale
          policy retries: A re-reads {"total": 120}, PUTs 130 If-Match "v2"

:class:`~celery_fencing.StaleETagError` is a :class:`~celery_fencing.StaleTokenError`,
so a :class:`~celery_fencing.celery.FencedTask` handles it with its on-stale
policy like any refused token. Unlike a token gate, the check is about the
*data*, not the *execution*: a stale execution that re-reads first gets a
fresh ETag and its write goes through, so the read and the write of one
update must be one :meth:`ConditionalHTTPClient.update_json` (or a GET whose
ETag you pass to :meth:`~ConditionalHTTPClient.put`), never a write of a value
computed before a fresh read.

Strong ETags only: ``If-Match`` compares strongly (RFC 9110), so a weak ETag
(``W/"..."``) would never match; it is refused before any I/O. A resource
served without an ETag does not support conditional writes, and
:meth:`~ConditionalHTTPClient.update_json` says so instead of writing blindly.

Built on ``urllib.request`` from the standard library: no dependency for a
helper that makes one request per read or write (it opens a connection per
request; put a pooled client behind your own code if that cost matters).
Errors: ``412`` raises :class:`~celery_fencing.StaleETagError`; any other
failure (refused connection, timeout, another non-2xx status) raises
:class:`~celery_fencing.GateUnavailableError` with the ``urllib`` error
chained (the write may or may not have happened on a timeout). Thread-safe;
nothing is kept between requests.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from ..context import current_token, resolve_token
from ..exceptions import FencingConfigurationError, GateUnavailableError, StaleETagError
from ..token import FencingToken
from ..values import seconds

__all__ = ["ConditionalHTTPClient", "HTTPDocument"]


@dataclass(frozen=True)
class HTTPDocument:
    """A representation read with GET: its body, its ETag and its content type."""

    url: str
    body: bytes
    etag: str | None
    content_type: str | None

    def json(self) -> Any:
        """The body decoded as JSON."""
        return json.loads(self.body)


class ConditionalHTTPClient:
    """Reads with GET and writes with ``If-Match`` / ``If-None-Match``; a ``412`` becomes ``StaleETagError``.

    :param timeout: seconds for each request (connect and read).
    :param headers: extra headers for every request (authentication, say).
    :param token_header: when set, every write also carries the fencing
        token's value in this header (e.g. ``"Fencing-Token"``), for services
        that can check it themselves; the current task's token, or ``token=``.
    :param opener: a ``urllib.request.OpenerDirector`` (proxies, TLS context);
        default: ``urllib.request.build_opener()``.
    :raises FencingConfigurationError: for a bad timeout or header name.
    """

    def __init__(
        self,
        *,
        timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
        token_header: str | None = None,
        opener: urllib.request.OpenerDirector | None = None,
    ) -> None:
        seconds("timeout", timeout)
        if token_header is not None and (not isinstance(token_header, str) or not token_header.strip()):
            raise FencingConfigurationError(f"token_header must be a header name, not {token_header!r}")
        self.timeout = float(timeout)
        self.headers = dict(headers or {})
        self.token_header = token_header
        self._opener = opener or urllib.request.build_opener()

    def get(self, url: str) -> HTTPDocument | None:
        """GET *url*; ``None`` when the server answers 404.

        :raises GateUnavailableError: any other failure.
        """
        request = urllib.request.Request(url, method="GET", headers=self.headers)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                body = response.read()
                return HTTPDocument(url, body, response.headers.get("ETag"), response.headers.get("Content-Type"))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            _unavailable("GET", url, exc)
        except OSError as exc:  # URLError, timeouts, refused connections
            _unavailable("GET", url, exc)

    def put(
        self,
        url: str,
        body: bytes | str,
        *,
        if_match: str | None = None,
        if_none_match: str | None = None,
        content_type: str = "application/octet-stream",
        method: str = "PUT",
        token: FencingToken | None = None,
    ) -> str | None:
        """Write *body* only if the resource is still at ETag *if_match* (or, with ``if_none_match="*"``, absent).

        Exactly one condition is required: an unconditional write is what this
        helper exists to prevent. Returns the new ETag, when the server sends one.

        :raises StaleETagError: the server answered 412: nothing was written.
        :raises GateUnavailableError: any other failure.
        :raises FencingConfigurationError: no condition, both, or a weak ETag (before any I/O).
        """
        if (if_match is None) == (if_none_match is None):
            raise FencingConfigurationError(
                "a conditional write needs exactly one of if_match=<ETag read> or if_none_match='*' (create only)"
            )
        if if_match is not None and (not if_match or if_match.startswith("W/")):
            raise FencingConfigurationError(
                f"If-Match needs a strong ETag (weak ones never match), not {if_match!r}: "
                "this resource does not support conditional writes"
            )
        headers = {**self.headers, "Content-Type": content_type}
        if if_match is not None:
            headers["If-Match"] = if_match
        else:
            headers["If-None-Match"] = str(if_none_match)
        fencing = token if token is not None else current_token()
        if self.token_header is not None:
            headers[self.token_header] = str(resolve_token(fencing).value)
        data = body.encode() if isinstance(body, str) else body
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                response.read()
                etag: str | None = response.headers.get("ETag")
                return etag
        except urllib.error.HTTPError as exc:
            if exc.code == 412:
                raise StaleETagError(
                    url=url,
                    etag=if_match if if_match is not None else f"If-None-Match {if_none_match}",
                    current_etag=exc.headers.get("ETag") if exc.headers is not None else None,
                    resource=fencing.resource if fencing is not None else None,
                    token=fencing.value if fencing is not None else None,
                ) from None
            _unavailable(method, url, exc)
        except OSError as exc:
            _unavailable(method, url, exc)

    def put_json(
        self,
        url: str,
        value: Any,
        *,
        if_match: str | None = None,
        if_none_match: str | None = None,
        token: FencingToken | None = None,
    ) -> str | None:
        """:meth:`put` of *value* as JSON."""
        body = json.dumps(value, separators=(",", ":"))
        return self.put(
            url,
            body,
            if_match=if_match,
            if_none_match=if_none_match,
            content_type="application/json",
            token=token,
        )

    def update_json(
        self, url: str, change: Callable[[Any], Any], *, create: Any = None, token: FencingToken | None = None
    ) -> tuple[Any, str | None]:
        """Read-modify-write of a JSON resource in one conditional round: GET, ``change(value)``, PUT If-Match.

        A missing resource (404) starts from *create* (when given) and is
        written with ``If-None-Match: *``. Returns the value written and its
        new ETag. Nothing is retried here: a ``StaleETagError`` goes to the
        task's policy, whose retry re-reads.

        :raises StaleETagError: the resource changed between the GET and the PUT.
        :raises FencingConfigurationError: the resource has no (strong) ETag, or is missing and *create* is ``None``.
        :raises GateUnavailableError: any other failure.
        """
        document = self.get(url)
        if document is None:
            if create is None:
                raise FencingConfigurationError(f"{url} does not exist (404) and no create= value was given")
            value = change(create)
            return value, self.put_json(url, value, if_none_match="*", token=token)
        if document.etag is None:
            raise FencingConfigurationError(f"{url} was served without an ETag: it does not support conditional writes")
        value = change(document.json())
        return value, self.put_json(url, value, if_match=document.etag, token=token)

    def __repr__(self) -> str:
        return f"ConditionalHTTPClient(timeout={self.timeout})"


def _unavailable(method: str, url: str, exc: OSError) -> NoReturn:
    if isinstance(exc, urllib.error.HTTPError):
        detail = f"answered {exc.code} {exc.reason}"
    else:
        detail = f"failed: {type(exc).__name__}: {exc}"
    raise GateUnavailableError(f"{method} {url} {detail}", gate="ConditionalHTTPClient") from exc
