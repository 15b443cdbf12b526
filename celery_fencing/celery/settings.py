"""Every ``fencing_*`` setting and its ``--fencing-*`` worker flag, in one table.

The table is the single source for the worker flags, for reading ``app.conf``
and for the configuration reference in the docs (a test checks the docs list
every entry). Settings are read with ``app.conf.get(name, default)``:
``app.add_defaults()`` would shadow the user's own config module.

Precedence: a worker flag wins over the setting; a task option (class
attribute, e.g. ``fencing_on_stale``) wins over both for that task.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..exceptions import FencingConfigurationError
from ..policies import POLICY_NAMES
from ..values import count, number, seconds

__all__ = ["SETTINGS", "FencingSettings", "Setting", "check_unknown_settings", "read_settings", "redelivery_horizon"]

MODES = ("token", "exclusive")


# Settings come from app.conf (numbers) and from worker flags (strings): both parse.


def _positive_float(name: str, value: Any) -> float:
    return seconds(name, value, parse=True)


def _non_negative_float(name: str, value: Any) -> float:
    return seconds(name, value, zero=True, parse=True)


def _fraction(name: str, value: Any) -> float:
    fraction = number(name, value, parse=True)
    if fraction > 1:
        raise FencingConfigurationError(f"{name} must be within [0, 1], not {value!r}")
    return fraction


def _factor(name: str, value: Any) -> float:
    return number(name, value, minimum=1, parse=True)


def _count(name: str, value: Any) -> int:
    return count(name, value, parse=True)


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise FencingConfigurationError(f"{name} must be true or false, not {value!r}")


def _choice(choices: tuple[str, ...]) -> Callable[[str, Any], str | None]:
    def parse(name: str, value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, str) and value.strip().lower() in choices:
            return value.strip().lower()
        raise FencingConfigurationError(f"{name}={value!r} is not one of {', '.join(choices)}")

    return parse


def _source(name: str, value: Any) -> Any:
    # A URL, a TokenSource, or a zero-argument factory called once per worker process.
    if value is None or isinstance(value, str) or callable(value) or hasattr(value, "mint"):
        return value
    raise FencingConfigurationError(f"{name} must be a URL, a token source or a factory, not {type(value).__name__}")


def _policy(name: str, value: Any) -> Any:
    if value is None or callable(value):
        return value
    return _choice(POLICY_NAMES)(name, value)


@dataclass(frozen=True)
class Setting:
    """One setting: its ``app.conf`` name, worker flag, default, parser and help text."""

    name: str
    default: Any
    parse: Callable[[str, Any], Any]
    help: str
    metavar: str = "VALUE"
    is_flag: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "fencing_source",
        None,
        _source,
        "Token source URL: zookeeper://h1:2181,h2:2181/fencing or sqlite:////var/lib/app/tokens.db. Required.",
        metavar="URL",
    ),
    Setting(
        "fencing_timeout",
        5.0,
        _positive_float,
        "Seconds a mint (or lease wait) may take, and a copy meeting an older execution's record waits for its seal.",
        metavar="SECONDS",
    ),
    Setting(
        "fencing_on_stale",
        None,
        _policy,
        "Default for tasks that set no fencing_on_stale: retry, defer, ignore, reject or raise. "
        "Unset: defer for task-id resources, retry for domain resources.",
        metavar="POLICY",
    ),
    Setting("fencing_mode", "token", _choice(MODES), "token (a token per execution) or exclusive.", metavar="MODE"),
    Setting(
        "fencing_max_retries", 10, _count, "Retries of a fenced-out or token-less attempt before failing.", metavar="N"
    ),
    Setting("fencing_retry_countdown", 1.0, _non_negative_float, "First retry delay, seconds.", metavar="SECONDS"),
    Setting("fencing_retry_backoff_factor", 2.0, _factor, "Each retry waits this many times longer.", metavar="X"),
    Setting("fencing_retry_max_delay", 60.0, _positive_float, "Cap on one retry delay, seconds.", metavar="SECONDS"),
    Setting("fencing_retry_jitter", 0.25, _fraction, "Fraction of each delay that is randomised.", metavar="FRACTION"),
    Setting(
        "fencing_defer_countdown",
        None,
        _non_negative_float,
        "Seconds before the retry of a copy that deferred to a newer execution of its task (the defer policy). "
        "Unset: half the broker's re-delivery horizon (visibility_timeout; 30 min for RabbitMQ); must be below it.",
        metavar="SECONDS",
    ),
    Setting(
        "fencing_allow_volatile_source",
        False,
        _flag,
        "Allow memory:// as the worker's source (tests only: it forgets its counter).",
        is_flag=True,
    ),
    Setting(
        "fencing_lease_reuse",
        0.0,
        _non_negative_float,
        "Exclusive mode: keep a lease and its token for the next task of the same resource in this "
        "worker process, for up to this many seconds after it was taken (0: release after every task).",
        metavar="SECONDS",
    ),
    Setting(
        "fencing_lock_delay",
        0.0,
        _non_negative_float,
        "Exclusive mode: seconds a resource stays un-grantable after its holder failed (worker killed, session "
        "lost) instead of releasing it, for sinks that cannot check tokens (0: off).",
        metavar="SECONDS",
    ),
    Setting(
        "fencing_once",
        True,
        _flag,
        "Exactly once per task id: gates record each task id with its effects, and a re-delivered or "
        "retried copy of a task that was applied does not apply again (true or false; the task option "
        "fencing_once overrides it).",
        metavar="BOOL",
    ),
    Setting(
        "fencing_once_retention",
        None,
        _positive_float,
        "Seconds the gates keep a task id's applied record. Unset: result_expires (1 day by default), "
        "and never less than the broker's re-delivery horizon (visibility_timeout, 30 min for RabbitMQ).",
        metavar="SECONDS",
    ),
    Setting(
        "fencing_claim_first_delivery",
        False,
        _flag,
        "Claim before the body on a task's first delivery too: its task id, or its result on a domain resource "
        "(exactly once makes that claim redundant, so it is skipped by default): for producers that publish "
        "one task id more than once, whose bodies must not start again.",
        is_flag=True,
    ),
    Setting(
        "fencing_abort_on_session_loss",
        False,
        _flag,
        "Stop a task at its next gate call once its ZooKeeper session was suspended or lost.",
        is_flag=True,
    ),
)

_BY_NAME = {setting.name: setting for setting in SETTINGS}


@dataclass(frozen=True)
class FencingSettings:
    """The resolved, validated settings of one app."""

    source: Any
    timeout: float
    on_stale: Any
    mode: str
    max_retries: int
    retry_countdown: float
    retry_backoff_factor: float
    retry_max_delay: float
    retry_jitter: float
    defer_countdown: float
    allow_volatile_source: bool
    lease_reuse: float
    lock_delay: float
    once: bool
    once_retention: float
    claim_first_delivery: bool
    abort_on_session_loss: bool


def read_settings(conf: Any) -> FencingSettings:
    """Read and validate every ``fencing_*`` setting from a Celery ``app.conf``.

    :raises FencingConfigurationError: naming the first bad setting.
    """
    check_unknown_settings(conf)
    values: dict[str, Any] = {}
    for entry in SETTINGS:
        raw = conf.get(entry.name, entry.default)
        values[entry.name.removeprefix("fencing_")] = entry.default if raw is None else entry.parse(entry.name, raw)
    if values["lease_reuse"] >= values["timeout"]:
        # Another process waits for a kept lease up to lease_reuse seconds: it must not time out first.
        raise FencingConfigurationError(
            f"fencing_lease_reuse ({values['lease_reuse']}) must be below fencing_timeout ({values['timeout']}): "
            "other processes wait up to that long for a kept lease"
        )
    horizon = redelivery_horizon(conf)
    values["defer_countdown"] = _defer_countdown(values["defer_countdown"], horizon)
    if values["once_retention"] is None:
        values["once_retention"] = max(_seconds(conf.get("result_expires", _DEFAULT_RESULT_EXPIRES)), horizon)
    elif values["once_retention"] < horizon:
        raise FencingConfigurationError(
            f"fencing_once_retention ({values['once_retention']:g}s) must not be shorter than the broker's "
            f"re-delivery horizon ({horizon:g}s): a copy re-delivered after its record expired would apply again"
        )
    return FencingSettings(**values)


#: Celery's default ``result_expires``: one day.
_DEFAULT_RESULT_EXPIRES = 86400.0
#: RabbitMQ's default ``consumer_timeout`` (30 minutes): past it the broker closes the
#: channel of a consumer that holds an unacknowledged message, and re-delivers it.
RABBITMQ_CONSUMER_TIMEOUT = 1800.0
#: kombu's default Redis ``visibility_timeout`` (one hour).
REDIS_VISIBILITY_TIMEOUT = 3600.0


def _seconds(value: Any) -> float:
    if value is None:
        return 0.0
    total = getattr(value, "total_seconds", None)
    return float(total()) if callable(total) else float(value)


def _defer_countdown(value: float | None, horizon: float) -> float:
    """The defer policy's countdown: *value*, or half the re-delivery *horizon*.

    Half, because the countdown and the retry's own run share one horizon: a
    worker holds the retry unacknowledged while it waits out its countdown, and
    the broker re-delivers a message held past the horizon (Redis's visibility
    timeout counts from the fetch; RabbitMQ closes a channel past
    ``consumer_timeout``). The other half is the time the newer copy had to
    finish first, which a body that fits the horizon normally did.
    """
    if value is None:
        return horizon / 2
    if value >= horizon > 0:
        raise FencingConfigurationError(
            f"fencing_defer_countdown ({value:g}s) must be below the broker's re-delivery horizon ({horizon:g}s): "
            "the deferred retry waits out its countdown unacknowledged, and past the horizon it is delivered again"
        )
    return value


def redelivery_horizon(conf: Any) -> float:
    """The longest time after which the app's broker may deliver a message again, in seconds.

    Redis, SQS and the other virtual transports re-deliver after their
    ``visibility_timeout``; RabbitMQ when a consumer exceeds ``consumer_timeout``.
    """
    options = conf.get("broker_transport_options") or {}
    visibility = options.get("visibility_timeout")
    broker = str(conf.get("broker_url") or "")
    if visibility is not None:
        return max(_seconds(visibility), 0.0)
    if broker.startswith(("amqp", "pyamqp", "rabbitmq")):
        return RABBITMQ_CONSUMER_TIMEOUT
    return REDIS_VISIBILITY_TIMEOUT


def check_unknown_settings(conf: Any) -> None:
    """Refuse a ``fencing_*`` name in *conf* that is no setting: a typo would otherwise be silently ignored.

    :raises FencingConfigurationError: naming the first unknown setting, with the closest known name.
    """
    for key in sorted(str(key) for key in conf):
        if key.lower().startswith("fencing_") and key not in _BY_NAME:
            close = difflib.get_close_matches(key.lower(), list(_BY_NAME), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else f"; known settings: {', '.join(_BY_NAME)}"
            raise FencingConfigurationError(f"unknown setting {key}{hint}")


def setting(name: str) -> Setting:
    """Look one setting up by its name."""
    return _BY_NAME[name]
