"""Fault injection for worker tests: pauses of pool processes, proven by the kernel's process state."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
from collections.abc import Callable

from .workers import process_state


class PauseNemesis(threading.Thread):
    """SIGSTOPs a random target process for a random while, again and again, until stopped.

    Every pause is counted only once /proc shows the process stopped (state T),
    so the figures report faults that really happened. Targets are re-read each
    round (prefork may replace pool processes).
    """

    def __init__(
        self,
        targets: Callable[[], list[int]],
        *,
        seed: int,
        pause: tuple[float, float] = (0.05, 0.6),
        gap: tuple[float, float] = (0.05, 0.3),
    ) -> None:
        super().__init__(daemon=True, name="pause-nemesis")
        self.targets = targets
        self.random = random.Random(seed)
        self.pause_range = pause
        self.gap_range = gap
        self.stopping = threading.Event()
        self.proven_pauses = 0

    def run(self) -> None:
        while not self.stopping.wait(self.random.uniform(*self.gap_range)):
            pids = self.targets()
            if not pids:
                continue
            pid = self.random.choice(pids)
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            try:
                if self._seen_stopped(pid):
                    self.proven_pauses += 1
                self.stopping.wait(self.random.uniform(*self.pause_range))
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def _seen_stopped(self, pid: int) -> bool:
        for _ in range(200):
            if process_state(pid) in ("T", "t"):
                return True
            if self.stopping.wait(0.005):
                return False
        return False

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)
