"""Requests to ZooKeeper, each bounded by a deadline, so that no call can hang.

Every request is sent with kazoo's ``*_async`` and awaited with
``.get(timeout=...)``; kazoo's retry helpers (which retry forever by default)
are not used. Errors: exceptions of the types a caller names as *expected*
propagate as kazoo raised them; every other failure, a timeout included,
becomes :class:`~celery_fencing.TokenUnavailableError` with the driver's error
chained. A request already sent when the connection drops may still run on
the server; its reply is discarded, so no token escapes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from kazoo.exceptions import NodeExistsError

from ...exceptions import TokenUnavailableError
from .session import Session

__all__ = ["collect", "create_path", "pipelined", "request", "send_checked_set"]


def request(
    session: Session,
    client: Any,
    send: Callable[[], Any],
    deadline: float,
    resource: str | None,
    what: str,
    *expected: type[BaseException],
) -> Any:
    """Send one request (after a state check) and wait for it until *deadline*."""
    session.await_connected(client, deadline, resource)
    session.require_connected(client, resource)
    return collect(session, client, send(), deadline, resource, what, *expected)


def collect(
    session: Session,
    client: Any,
    async_result: Any,
    deadline: float,
    resource: str | None,
    what: str,
    *expected: type[BaseException],
) -> Any:
    """Wait until *deadline* for a request already sent."""
    try:
        return async_result.get(timeout=max(0.001, deadline - time.monotonic()))
    except expected:
        raise
    except Exception as exc:
        if isinstance(exc, client.handler.timeout_exception):
            message = f"ZooKeeper did not answer {what} within the timeout ({session.where()})"
        else:
            message = f"ZooKeeper {what} failed ({session.where()}): {type(exc).__name__}: {exc}"
        raise TokenUnavailableError(message, resource=resource) from exc


def pipelined(
    session: Session,
    client: Any,
    names: list[str],
    send: Callable[[str], Any],
    deadline: float,
    what: str,
    window: int,
    *expected: type[BaseException],
) -> Iterator[tuple[str, Any]]:
    """Yield ``(name, reply)`` for ``send(name)`` over *names*, keeping at most *window* requests in flight.

    An *expected* error is yielded as the exception instead of a reply.
    """
    in_flight: list[tuple[str, Any]] = []
    position = 0
    while position < len(names) or in_flight:
        while position < len(names) and len(in_flight) < window:
            session.require_connected(client, None)
            in_flight.append((names[position], send(names[position])))
            position += 1
        batch, in_flight = in_flight, []
        for name, async_result in batch:
            try:
                yield name, collect(session, client, async_result, deadline, None, what, *expected)
            except expected as exc:
                yield name, exc


def create_path(session: Session, client: Any, path: str, deadline: float, resource: str) -> None:
    """Create the znode at *path* (and its parents) unless it exists."""
    with contextlib.suppress(NodeExistsError):
        request(
            session,
            client,
            lambda: client.create_async(path, b"", makepath=True),
            deadline,
            resource,
            "create",
            NodeExistsError,
        )


def send_checked_set(client: Any, lock_path: str, path: str, data: bytes, version: int = -1) -> Any:
    """Send ``[check(lock_path), setData(path, data, version)]``: a write only the lock node's holder can make.

    A failed multi-op does not raise: its reply lists an error per operation.
    """
    transaction = client.transaction()
    transaction.check(lock_path, -1)
    transaction.set_data(path, data, version)
    return transaction.commit_async()
