"""Settings that do not exist are refused, with the closest known name: a typo must not be silently ignored."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_fencing import FencingConfigurationError
from celery_fencing.celery.settings import read_settings


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("fencing_timout", "did you mean fencing_timeout?"),
        ("fencing_max_retires", "did you mean fencing_max_retries?"),
        ("FENCING_ONCE", "did you mean fencing_once?"),
        ("fencing_zzzzzzzzzzzz", "known settings: fencing_source"),
    ],
)
def test_unknown_fencing_setting_is_refused_with_a_hint(name: str, hint: str) -> None:
    """read_settings (the worker's start and doctor) names the unknown setting and the closest one."""
    app = Celery("typos", set_as_current=False)
    app.conf[name] = 3
    with pytest.raises(FencingConfigurationError, match=f"unknown setting {name}") as refused:
        read_settings(app.conf)
    assert hint in str(refused.value)


def test_other_settings_are_left_alone() -> None:
    """Only fencing_* names are ours to check; the known ones read as before."""
    app = Celery("typos", set_as_current=False)
    app.conf.update(fencing_timeout=3, my_app_setting=1)
    assert read_settings(app.conf).timeout == 3
