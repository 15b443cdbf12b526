"""Polling with a deadline: the only way these tests wait for something to happen (the testing kit's ``wait_for``)."""

from __future__ import annotations

from celery_fencing.testing.processes import wait_for

__all__ = ["wait_for"]
