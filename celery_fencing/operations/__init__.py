"""What the operator commands do: ``celery-fencing inspect`` and ``celery-fencing doctor``.

:mod:`.inspection` reads tokens and marks without changing them, :mod:`.doctor`
checks a Celery app's fencing setup, :mod:`.urls` turns gate URLs into gates.
The command line itself (argument parsing, output) lives in :mod:`celery_fencing.cli`.
Drivers are imported only when a URL needs them.
"""

from __future__ import annotations

__all__: list[str] = []
