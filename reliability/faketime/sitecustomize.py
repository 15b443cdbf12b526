"""Loaded (as ``sitecustomize``) only by workers run under libfaketime; see reliability.services.

libfaketime 0.9.10 (Debian bookworm) with ``FAKETIME_DONT_FAKE_MONOTONIC=1``
hands a negative deadline to ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``,
which Python 3.11's ``time.sleep`` uses, so every sleep fails with EINVAL
(wolfcw/libfaketime#426). This replaces ``time.sleep`` before anything imports
it with a sleep on ``select()``, measured on the real monotonic clock. Only the
wall clock is faked, as a clock step (NTP, a VM resume) moves it in reality.
"""

from __future__ import annotations

import os
import select
import time

if "faketime" in os.environ.get("LD_PRELOAD", "") and os.environ.get("FAKETIME_DONT_FAKE_MONOTONIC") == "1":
    _monotonic = time.monotonic

    def _sleep(seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        deadline = _monotonic() + seconds
        while True:
            left = deadline - _monotonic()
            if left <= 0:
                return
            select.select([], [], [], left)

    time.sleep = _sleep
