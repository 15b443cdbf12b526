"""A TCP proxy whose connections a test can cut: now :class:`celery_fencing.testing.TcpProxy` (see its module)."""

from __future__ import annotations

from celery_fencing.testing.redelivery import TcpProxy

__all__ = ["TcpProxy"]
