"""Lock nodes a session may have left behind, found again by their unique prefix and deleted.

A lock node whose ``create`` timed out may still be created (or was, its
reply lost), and one whose ``delete`` could not be sent or answered may still
be there: either would block every later holder until the session ends. Such
nodes are recorded in :attr:`Session.orphans <.session.Session.orphans>` and
deleted when the request completes, when the session reconnects, or before
the next lease. Best effort, never raising: errors leave an orphan recorded
(and logged) for the next attempt; an expired session took its ephemeral
nodes with it, and the session then forgets them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from typing import Any

from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import KazooState

from ...exceptions import FencingConfigurationError, TokenUnavailableError
from .calls import request
from .names import lock_prefix
from .session import Session

__all__ = ["clean_orphans", "delete_lock_node", "track_orphan"]

log = logging.getLogger(__package__)


def track_orphan(
    session: Session, client: Any, lock_dir: str, prefix: str, async_result: Any, *, deleting: bool = False
) -> None:
    """Record a lock node as possibly left behind until *async_result* (its create or delete) says otherwise."""
    key = (lock_dir, prefix)
    with session.lock:
        session.orphans.add(key)

    def done(result: Any) -> None:
        # On kazoo's completion thread: no waiting, only async requests.
        exc = result.exception
        if deleting:
            if exc is None or isinstance(exc, NoNodeError):
                with session.lock:
                    session.orphans.discard(key)
        elif exc is None:
            # A lock node created after its caller gave up: delete it.
            follow_up = client.delete_async(result.value)
            track_orphan(session, client, lock_dir, prefix, follow_up, deleting=True)

    async_result.rawlink(done)


def delete_lock_node(session: Session, client: Any, path: str, *, wait: bool) -> None:
    """Delete a lock node, waiting (at most the source's timeout) only if *wait*; tracked until it is gone."""
    lock_dir, name = path.rsplit("/", 1)
    prefix = lock_prefix(name)
    if not (client.connected and client.state == KazooState.CONNECTED):
        # Not sent while suspended (it could run later on a new session, harmlessly, but
        # it could also be dropped): remember it; it is retried once reconnected.
        with session.lock:
            session.orphans.add((lock_dir, prefix))
        return
    async_result = client.delete_async(path)
    track_orphan(session, client, lock_dir, prefix, async_result, deleting=True)
    if wait:
        with contextlib.suppress(Exception):
            async_result.get(timeout=session.timeout)


def clean_orphans(session: Session, client: Any, deadline: float | None = None) -> None:
    """Delete lock nodes this session left behind; best effort, bounded by *deadline*."""
    if deadline is None:
        deadline = time.monotonic() + session.timeout
    with session.lock:
        orphans = list(session.orphans)
    for lock_dir, prefix in orphans:
        try:
            children = request(
                session,
                client,
                functools.partial(client.get_children_async, lock_dir),
                deadline,
                None,
                "getChildren",
                NoNodeError,
            )
            for name in children:
                if name.startswith(prefix):
                    request(
                        session,
                        client,
                        functools.partial(client.delete_async, f"{lock_dir}/{name}"),
                        deadline,
                        None,
                        "delete",
                        NoNodeError,
                    )
        except NoNodeError:
            pass
        except (TokenUnavailableError, FencingConfigurationError) as exc:
            log.info("could not clean up lock nodes under %r yet: %s", lock_dir, exc)
            continue
        with session.lock:
            session.orphans.discard((lock_dir, prefix))
