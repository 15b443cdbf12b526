"""The fencing_* settings: defaults, parsing of flag strings, and errors that name the setting."""

from __future__ import annotations

import pytest

from celery_fencing import FencingConfigurationError
from celery_fencing.celery.settings import SETTINGS, read_settings


def test_defaults() -> None:
    """With nothing configured, every setting has its documented default."""
    settings = read_settings({})
    assert settings.source is None
    assert settings.timeout == 5.0 and settings.mode == "token" and settings.max_retries == 10
    assert settings.on_stale is None and settings.allow_volatile_source is False


@pytest.mark.parametrize(
    ("conf", "countdown"),
    [
        ({}, 1800.0),  # Redis's default visibility timeout: one hour
        ({"broker_transport_options": {"visibility_timeout": 60}}, 30.0),
        ({"broker_url": "amqp://guest@localhost//"}, 900.0),  # RabbitMQ's consumer_timeout: 30 minutes
        ({"broker_transport_options": {"visibility_timeout": 60}, "fencing_defer_countdown": "59"}, 59.0),
        ({"fencing_defer_countdown": 0}, 0.0),
    ],
    ids=["redis-default", "visibility-timeout", "rabbitmq", "explicit", "zero"],
)
def test_defer_countdown_defaults_to_half_the_redelivery_horizon(conf: dict[str, object], countdown: float) -> None:
    """Unset, the defer policy's countdown is half the broker's re-delivery horizon; set, it is taken as it is."""
    assert read_settings(conf).defer_countdown == countdown


def test_defer_countdown_past_the_redelivery_horizon_is_refused() -> None:
    """A deferred retry held past the horizon would be delivered again: the setting must stay below it."""
    conf = {"broker_transport_options": {"visibility_timeout": 60}, "fencing_defer_countdown": 60}
    with pytest.raises(FencingConfigurationError, match=r"fencing_defer_countdown \(60s\) must be below .* \(60s\)"):
        read_settings(conf)


def test_flag_strings_parse() -> None:
    """Worker flags arrive as strings; they parse into typed values."""
    settings = read_settings(
        {
            "fencing_timeout": "2.5",
            "fencing_max_retries": "3",
            "fencing_on_stale": "RAISE",
            "fencing_mode": "exclusive",
            "fencing_retry_jitter": "0",
            "fencing_abort_on_session_loss": "true",
        }
    )
    assert settings.timeout == 2.5 and settings.max_retries == 3 and settings.on_stale == "raise"
    assert settings.mode == "exclusive" and settings.retry_jitter == 0 and settings.abort_on_session_loss


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("fencing_timeout", "0"),
        ("fencing_timeout", "nan"),
        ("fencing_timeout", True),
        ("fencing_max_retries", "-1"),
        ("fencing_max_retries", 2.5),
        ("fencing_retry_jitter", "1.5"),
        ("fencing_retry_backoff_factor", "0.5"),
        ("fencing_mode", "shared"),
        ("fencing_on_stale", "panic"),
        ("fencing_defer_countdown", "-1"),
        ("fencing_defer_countdown", 3600),
        ("fencing_allow_volatile_source", "maybe"),
        ("fencing_source", 42),
    ],
    ids=repr,
)
def test_bad_values_name_the_setting(name: str, value: object) -> None:
    """A bad value raises FencingConfigurationError whose message names the setting."""
    with pytest.raises(FencingConfigurationError, match=name):
        read_settings({name: value})


def test_every_setting_has_a_flag_and_help() -> None:
    """Each setting maps to a --fencing-* flag with help text."""
    for setting in SETTINGS:
        assert setting.name.startswith("fencing_")
        assert setting.flag == "--" + setting.name.replace("_", "-")
        assert setting.help
