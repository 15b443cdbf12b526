"""Create-or-setData: the one write per token znode that mints a token, guessing which of the two succeeds.

A znode this process has written is set (``setData``); any other is most
likely new and is created, its ``create`` being the write. ZooKeeper says which
guess was wrong (``NoNode``, ``NodeExists``) and the other write is sent:
a wrong guess costs one request, never a wrong token. Errors: a failed or late
reply raises :class:`~celery_fencing.TokenUnavailableError`, as does a znode
that keeps being created and deleted under the writer.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError

from ...exceptions import TokenUnavailableError
from .calls import collect
from .session import Session

__all__ = ["TokenWriter"]

# How many token znodes a source remembers having written.
_KNOWN_PATHS = 10_000
# How far the create-or-setData guess for unknown znodes looks back.
_GUESS_MEMORY = 8


class TokenWriter:
    """The token znode writes of one source, and its memory of which znodes exist."""

    def __init__(self, session: Session) -> None:
        self._session = session
        # Token znodes this process wrote (oldest first, bounded).
        self._known: dict[str, None] = {}
        # Creates that found no znode minus creates that found one, within +-_GUESS_MEMORY.
        self._creates_won = 0

    def write(self, client: Any, names: list[str], paths: list[str], deadline: float) -> list[Any]:
        """One write per path (``setData``, or ``create`` of a new znode), pipelined; their stats in order."""
        session = self._session
        known = self._known
        # A znode this process has written exists (unless pruned since): setData. Any
        # other is most likely new: create it, its create being the one write.
        # Unknown beyond the bounded memory, an old resource would pay a failed create
        # first: _creates_won tracks how create-first guesses have fared lately.
        create_unknown = self._creates_won >= 0
        unknown = [path not in known for path in paths]
        creating = [create_unknown and new for new in unknown]
        stats: list[Any] = [None] * len(names)
        pending = list(range(len(names)))
        for _ in range(3):
            session.await_connected(client, deadline, names[pending[0]])
            sent = []
            for index in pending:
                session.require_connected(client, names[index])
                if creating[index]:
                    async_result = client.create_async(paths[index], b"", makepath=True, include_data=True)
                else:
                    async_result = client.set_async(paths[index], b"")
                sent.append((index, async_result))
            pending = []
            for index, async_result in sent:
                what = "create" if creating[index] else "setData"
                try:
                    reply = collect(
                        session, client, async_result, deadline, names[index], what, NoNodeError, NodeExistsError
                    )
                except (NoNodeError, NodeExistsError) as exc:
                    # Created by another minter meanwhile, or pruned: the other write will do.
                    if unknown[index]:
                        self._guessed(isinstance(exc, NoNodeError))
                        unknown[index] = False
                    creating[index] = isinstance(exc, NoNodeError)
                    pending.append(index)
                    continue
                if unknown[index]:
                    self._guessed(creating[index])
                stats[index] = reply[1] if creating[index] else reply
                self._remember(paths[index])
            if not pending:
                return stats
        raise TokenUnavailableError(
            f"the znode of {names[pending[0]]!r} kept being created and deleted while minting",
            resource=names[pending[0]],
        )

    def forget(self, path: str) -> None:
        """A token znode was deleted (pruned): its next mint is a create again."""
        self._known.pop(path, None)

    def _guessed(self, was_new: bool) -> None:
        # Evidence on an unknown znode: it was new (a create won, a setData found none) or not.
        step = 1 if was_new else -1
        self._creates_won = max(-_GUESS_MEMORY, min(_GUESS_MEMORY, self._creates_won + step))

    def _remember(self, path: str) -> None:
        known = self._known
        if path not in known:
            if len(known) >= _KNOWN_PATHS:
                with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                    del known[next(iter(known))]
            known[path] = None
