"""How Celery reaches each fenced backend: the ``fenced`` entry point and its URL forms, and a clear error otherwise."""

from __future__ import annotations

import pytest
from celery import Celery
from celery.app.backends import by_url
from celery.exceptions import ImproperlyConfigured

from celery_fencing.celery.backend import FencedRedisBackend
from celery_fencing.celery.backend_db import FencedDatabaseBackend


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("fenced+redis://127.0.0.1:6379/0", FencedRedisBackend),
        ("fenced+rediss://127.0.0.1:6379/0?ssl_cert_reqs=required", FencedRedisBackend),
        ("fenced+db+sqlite:///results.db", FencedDatabaseBackend),
        ("fenced+db+postgresql+psycopg://app@127.0.0.1/app", FencedDatabaseBackend),
    ],
)
def test_each_url_form_builds_its_fenced_backend(url: str, expected: type) -> None:
    """result_backend = fenced+<url> builds the fenced class for <url>, with the URL its plain backend expects."""
    app = Celery("schemes", backend=url, set_as_current=False)
    app.conf.database_create_tables_at_setup = False
    assert type(app.backend) is expected
    if expected is FencedDatabaseBackend:
        assert app.backend.url == url.removeprefix("fenced+db+")


@pytest.mark.parametrize("url", ["fenced+django-db", "fenced+django-db://"])
def test_both_django_spellings_build_the_fenced_django_backend(url: str, django_project: None) -> None:
    """fenced+django-db (its own entry point, as django-db) and fenced+django-db:// (through fenced) are one backend."""
    from celery_fencing.celery.backend_django import FencedDjangoBackend

    app = Celery("schemes", backend=url, set_as_current=False)
    assert type(app.backend) is FencedDjangoBackend


def test_an_unknown_scheme_is_a_one_line_error() -> None:
    """fenced+mongodb:// names what is wrong and what would do, in one line."""
    backend, url = by_url("fenced+mongodb://127.0.0.1/results")
    with pytest.raises(ImproperlyConfigured) as caught:
        backend(app=Celery("schemes", set_as_current=False), url=url)
    message = str(caught.value)
    assert "\n" not in message and "'mongodb://127.0.0.1/results'" in message and "fenced+db+" in message
