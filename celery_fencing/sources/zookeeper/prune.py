"""Pruning: deleting the token znodes (and empty lock directories) of resources idle for long enough.

Safe because a token is a zxid, global to the ensemble: a resource minted
again after its znode went gets a new znode whose first write is above every
token minted before. Each token znode is deleted with the version its
``exists`` returned, so a resource minted meanwhile is kept, and a lock
directory only goes when ZooKeeper finds it empty. Errors: bad arguments raise
:class:`~celery_fencing.FencingConfigurationError` before anything is sent; a
failed or late request raises :class:`~celery_fencing.TokenUnavailableError`,
and what was deleted so far stays deleted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kazoo.exceptions import BadVersionError, NoNodeError, NotEmptyError
from kazoo.protocol.states import ZnodeStat

from ...exceptions import FencingConfigurationError
from ...values import seconds
from .calls import pipelined, request
from .names import Layout
from .session import Session

__all__ = ["prune_idle"]

log = logging.getLogger(__package__)


def prune_idle(
    session: Session,
    layout: Layout,
    older_than: float,
    timeout: float | None,
    window: int,
    forget: Callable[[str], object],
) -> int:
    """Delete the znodes of resources not minted for *older_than* seconds; ``forget(path)`` each deleted one.

    Requests are pipelined, at most *window* in flight. Returns how many token znodes went.
    """
    seconds("older_than", older_than, zero=True)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise FencingConfigurationError(f"window must be a positive int, got {window!r}")
    deadline = session.deadline(timeout)
    client = session.usable_client(None)
    cutoff_ms = (time.time() - float(older_than)) * 1000
    tokens_dir, locks_dir = layout.tokens, layout.locks
    try:
        names = request(
            session, client, lambda: client.get_children_async(tokens_dir), deadline, None, "getChildren", NoNodeError
        )
    except NoNodeError:
        return 0
    idle: list[tuple[str, int]] = []
    for stat_name, stat in pipelined(
        session, client, names, lambda name: client.exists_async(f"{tokens_dir}/{name}"), deadline, "exists", window
    ):
        if isinstance(stat, ZnodeStat) and stat.mtime < cutoff_ms:
            idle.append((stat_name, stat.version))
    versions = dict(idle)
    pruned = [
        name
        for name, outcome in pipelined(
            session,
            client,
            [name for name, _ in idle],
            lambda name: client.delete_async(f"{tokens_dir}/{name}", version=versions[name]),
            deadline,
            "delete",
            window,
            BadVersionError,
            NoNodeError,
        )
        if outcome is True
    ]
    for name in pruned:
        forget(f"{tokens_dir}/{name}")
    # Empty lock directories of the pruned resources; one with a holder or waiter is refused.
    for _ in pipelined(
        session,
        client,
        pruned,
        lambda name: client.delete_async(f"{locks_dir}/{name}"),
        deadline,
        "delete",
        window,
        NotEmptyError,
        NoNodeError,
    ):
        pass
    log.info("pruned %d idle resource znode(s) under %s", len(pruned), tokens_dir)
    return len(pruned)
