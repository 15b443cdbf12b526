"""Grantor identity, and the token a write's stat makes.

The first source to reach an ensemble stores a random id in ``<root>/grantor``
(a ``create`` that only one client wins; the others read the winner's id), and
every token carries it. The id is cached per ZooKeeper session: a wiped
server cannot continue an old session, so a new session reads it again.
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

from ...exceptions import InvalidTokenError, TokenUnavailableError
from ...token import FencingToken, validate_grantor, validate_token_value
from .calls import request
from .names import Layout
from .session import Session, session_of

__all__ = ["Grantor", "token_from"]

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
        try:
            request(
                session,
                client,
                lambda: client.create_async(path, candidate.encode(), makepath=True),
                deadline,
                resource,
                "create grantor",
                NodeExistsError,
            )
            grantor = candidate
            log.warning("ZooKeeper %s%s had no grantor id: created %s", session.where(), self._layout.root, grantor)
        except NodeExistsError:
            data, _ = request(session, client, lambda: client.get_async(path), deadline, resource, "getData grantor")
            text = bytes(data or b"").decode("ascii", "replace").strip()
            try:
                grantor = validate_grantor(text) or ""
            except InvalidTokenError as exc:
                raise TokenUnavailableError(f"{path} does not hold a grantor id: {exc}", resource=resource) from exc
        self._cached = (session_id, grantor)
        return self._cached


def token_from(resource: str, stat: Any, grantor: str) -> FencingToken:
    """The token of the write whose stat is *stat*: its ``mzxid``."""
    if not isinstance(stat, ZnodeStat):
        raise TokenUnavailableError(f"ZooKeeper returned {stat!r} instead of a ZnodeStat", resource=resource)
    try:
        return FencingToken(resource, validate_token_value(stat.mzxid), grantor)
    except InvalidTokenError as exc:
        raise TokenUnavailableError(f"ZooKeeper returned an unusable zxid: {exc}", resource=resource) from exc
