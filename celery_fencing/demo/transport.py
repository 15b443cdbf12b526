"""The demo's broker: kombu's filesystem transport, with each message file written whole before it is visible.

kombu's filesystem transport creates a message file under its final name and
then writes it, so a worker polling the folder can take the file while it is
still empty and die on "Expecting value" (kombu issue 1551); on a busy machine
the demo's two workers and its producer meet that race. Here a message is
written under a name the consumers skip, then renamed into place: a rename is
atomic, so a consumer sees the whole file or none.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps

__all__ = ["AtomicFilesystemTransport"]


class AtomicFilesystemChannel(filesystem.Channel):
    """A filesystem channel whose ``_put`` renames a complete file into the queue folder."""

    # kombu's own two declarations of _put disagree (queue, message) / (queue, payload, **kwargs).
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # The name as kombu makes it (its consumers take files in name order: oldest first).
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.part")  # no '<queue>.msg' suffix: never taken
        try:
            with open(partial, "wb") as out:
                out.write(dumps(payload).encode("utf-8"))  # type: ignore[no-untyped-call]
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class AtomicFilesystemTransport(filesystem.Transport):
    """kombu's filesystem transport with :class:`AtomicFilesystemChannel`."""

    Channel = AtomicFilesystemChannel
