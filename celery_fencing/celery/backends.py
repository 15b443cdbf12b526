"""The ``fenced`` result backend scheme: one entry point, the fenced class picked by the rest of the URL.

Celery splits ``result_backend = "fenced+<rest>"`` at its first ``+`` and
looks ``fenced`` up in the ``celery.result_backends`` entry points, which
name :class:`FencedBackend`; it builds the backend for *<rest>*:

======================================  ===========================================================
``fenced+redis://``, ``fenced+rediss://``  :class:`~celery_fencing.celery.backend.FencedRedisBackend`
``fenced+db+<SQLAlchemy URL>``             :class:`~celery_fencing.celery.backend_db.FencedDatabaseBackend`
``fenced+django-db://``                    :class:`~celery_fencing.celery.backend_django.FencedDjangoBackend`
======================================  ===========================================================

``fenced+django-db`` (no ``://``, as django-celery-results' own ``django-db``)
is an entry point of its own, naming the Django class directly.
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import ImproperlyConfigured
from celery.utils.imports import symbol_by_name

__all__ = ["FencedBackend", "fenced_backend_class"]

_BY_SCHEME = {
    "redis": "celery_fencing.celery.backend:FencedRedisBackend",
    "rediss": "celery_fencing.celery.backend:FencedRedisBackend",
    "db": "celery_fencing.celery.backend_db:FencedDatabaseBackend",
    "django-db": "celery_fencing.celery.backend_django:FencedDjangoBackend",
}


def fenced_backend_class(url: str | None) -> Any:
    """The fenced backend class for *url*, the part of ``result_backend`` after ``fenced+``.

    :raises ImproperlyConfigured: no fenced backend for that scheme.
    """
    scheme = (url or "").partition("://")[0].partition("+")[0]
    path = _BY_SCHEME.get(scheme)
    if path is None:
        raise ImproperlyConfigured(
            f"no fenced result backend for {url!r}: use fenced+redis://, fenced+rediss://, "
            "fenced+db+<SQLAlchemy URL> or fenced+django-db"
        )
    return symbol_by_name(path)


class FencedBackend:
    """What the ``fenced`` entry point names: called as Celery calls a backend class, it builds the fenced one."""

    def __new__(cls, *args: Any, url: str | None = None, **kwargs: Any) -> Any:
        return fenced_backend_class(url)(*args, url=url, **kwargs)
