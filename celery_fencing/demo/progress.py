"""The runner's one status line on stderr: what it is waiting for, with a countdown on a terminal."""

from __future__ import annotations

import shutil
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """One status line on stderr: rewritten in place on a terminal, one line per change otherwise."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last = ""

    def show(self, message: str, detail: str = "") -> None:
        """Show *message*; *detail* (a countdown) is shown on a terminal only, so logs stay short."""
        if self.tty:
            line = f"... {message} {detail}".rstrip()
            # One terminal row at most: \r cannot go back over a wrapped line.
            line = line[: max(20, shutil.get_terminal_size().columns - 1)]
            if line != self.last:
                self.stream.write("\r\033[K" + line)
                self.last = line
        elif message != self.last:
            self.stream.write("... " + message + "\n")
            self.last = message
        self.stream.flush()

    def clear(self) -> None:
        if self.tty and self.last:
            self.stream.write("\r\033[K")
            self.stream.flush()
        self.last = ""
