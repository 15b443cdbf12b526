"""Grantor identity and token scale, and the token a write's stat makes.

The first source to reach an ensemble stores a random id in ``<root>/grantor``
(a ``create`` that only one client wins; the others read the winner's id), and
every token carries it. The id is cached per ZooKeeper session: a wiped
server cannot continue an old session, so a new session reads it again.

A token is the write's zxid times ``2**SCALE_BITS`` (:mod:`celery_fencing.blocks`):
the room below the next zxid holds a block of tokens that one write reserves.
The scale is part of the grantor's identity, stored once in
``<root>/token-scale`` beside the id: tokens on two scales would not order,
so a source of another scale is refused with
:class:`~celery_fencing.GrantorMismatchError` before it mints. Roots of
versions that minted raw zxids get the scale on first use; their marks are
raw zxids, below every scaled token, so the new tokens pass them.
Errors: no session, a failed or late request, or a ``grantor`` znode that
holds no grantor id raise :class:`~celery_fencing.TokenUnavailableError`; so
does a stat that is not a usable zxid, so no malformed token is handed out.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from kazoo.exceptions import NodeExistsError
from kazoo.protocol.states import ZnodeStat

from ...blocks import SCALE_BITS
from ...exceptions import GrantorMismatchError, InvalidTokenError, TokenUnavailableError
from ...token import MAX_TOKEN_VALUE, FencingToken, validate_grantor, validate_token_value
from .calls import request
from .names import Layout
from .session import Session, session_of

__all__ = ["Grantor", "scaled", "token_from"]

log = logging.getLogger(__package__)


class Grantor:
    """The ensemble's grantor id, in ``<root>/grantor``, read (or created) once per session."""

    def __init__(self, session: Session, layout: Layout) -> None:
        self._session = session
        self._layout = layout
        # (session id, grantor id) of the session the id was last read in.
        self._cached: tuple[int, str] | None = None

    def current(self, client: Any, deadline: float, resource: str | None) -> tuple[int, str]:
        """``(session id, grantor id)``: the id read (or created) in the current session."""
        session = self._session
        session.await_connected(client, deadline, resource)
        session_id = session_of(client)
        if session_id is None:
            raise TokenUnavailableError(f"no ZooKeeper session ({session.state}); nothing was sent", resource=resource)
        cached = self._cached
        if cached is not None and cached[0] == session_id:
            return cached
        path = self._layout.grantor
        candidate = f"zk-{uuid.uuid4().hex}"
        text, created = self._create_or_read(client, deadline, resource, path, candidate)
        if created:
            log.warning("ZooKeeper %s%s had no grantor id: created %s", session.where(), self._layout.root, text)
        try:
            grantor = validate_grantor(text) or ""
        except InvalidTokenError as exc:
            raise TokenUnavailableError(f"{path} does not hold a grantor id: {exc}", resource=resource) from exc
        # The scale is checked with the id: a source on another scale never mints here.
        scale, _ = self._create_or_read(client, deadline, resource, self._layout.scale, str(SCALE_BITS))
        if scale != str(SCALE_BITS):
            raise GrantorMismatchError(
                f"ZooKeeper {session.where()}{self._layout.root} scales its tokens by 2**{scale[:20]} "
                f"({self._layout.scale}), this source by 2**{SCALE_BITS}: tokens on two scales do not order; "
                "run one version of celery-fencing per root",
                resource=resource,
            )
        self._cached = (session_id, grantor)
        return self._cached

    def _create_or_read(
        self, client: Any, deadline: float, resource: str | None, path: str, candidate: str
    ) -> tuple[str, bool]:
        """Create *path* holding *candidate*, or read what the client that won stored: ``(text, created)``."""
        session = self._session
        name = path.rsplit("/", 1)[-1]
        try:
            request(
                session,
                client,
                lambda: client.create_async(path, candidate.encode(), makepath=True),
                deadline,
                resource,
                f"create {name}",
                NodeExistsError,
            )
            return candidate, True
        except NodeExistsError:
            data, _ = request(session, client, lambda: client.get_async(path), deadline, resource, f"getData {name}")
            return bytes(data or b"").decode("ascii", "replace").strip(), False


def scaled(zxid: int) -> int:
    """The first token of the block a write with this zxid reserves: ``zxid * 2**SCALE_BITS``."""
    return zxid << SCALE_BITS


def token_from(resource: str, stat: Any, grantor: str) -> FencingToken:
    """The token of the write whose stat is *stat*: its ``mzxid``, scaled (the first of its block)."""
    if not isinstance(stat, ZnodeStat):
        raise TokenUnavailableError(f"ZooKeeper returned {stat!r} instead of a ZnodeStat", resource=resource)
    try:
        zxid = validate_token_value(stat.mzxid)
        # A block's last token must fit too: zxid < 2**53 (epochs below 2**21 elections).
        if scaled(zxid + 1) - 1 > MAX_TOKEN_VALUE:
            raise InvalidTokenError(f"zxid {zxid:#x} times 2**{SCALE_BITS} does not fit in 63 bits")
        return FencingToken(resource, scaled(zxid), grantor)
    except InvalidTokenError as exc:
        raise TokenUnavailableError(f"ZooKeeper returned an unusable zxid: {exc}", resource=resource) from exc
