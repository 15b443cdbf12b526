"""The broker's part of the check-up: it answers, and it does not re-deliver a task while the task still runs.

``visibility_timeout`` (Redis, SQS) against the time limits of ``acks_late``
tasks and against the longest retry delay (a message waiting for its ETA or
countdown stays unacknowledged); RabbitMQ's ``consumer_timeout`` likewise.
"""

from __future__ import annotations

import math
from typing import Any

from ...urls import redact_url
from .config_values import positive_seconds, url_scheme
from .report import Report, join_names

__all__ = ["RABBITMQ_CONSUMER_TIMEOUT", "VISIBILITY_DEFAULTS", "TimingChecks"]

#: Default visibility timeouts of kombu's transports that have one, in seconds.
VISIBILITY_DEFAULTS = {"redis": 3600.0, "rediss": 3600.0, "sentinel": 3600.0, "sqs": 1800.0}
#: RabbitMQ's default consumer_timeout (since 3.8.15), in seconds.
RABBITMQ_CONSUMER_TIMEOUT = 1800.0


class TimingChecks(Report):
    """Checks of the broker and of the re-delivery timing."""

    def brokerurl_scheme(self) -> str:
        return url_scheme(self.app.conf.broker_url) or "amqp"

    def check_broker(self) -> None:
        shown = redact_url(str(self.app.conf.broker_url or "amqp://guest@localhost//"))
        try:
            with self.app.connection_for_write(connect_timeout=5) as conn:
                conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=5)
        except ImportError as exc:
            self.add(
                "broker",
                "error",
                f"the transport for broker {shown} cannot be loaded: {exc}",
                f"install the transport's dependencies, e.g. pip install 'celery[{self.brokerurl_scheme()}]'",
            )
            return
        except Exception as exc:
            self.add("broker", "error", f"broker {shown} is unreachable: {exc}", "check broker_url and the server")
            return
        self.add("broker", "ok", f"broker {shown} answers")

    def check_timing(self, settings: Any, fenced: list[Any]) -> None:
        scheme = self.brokerurl_scheme()
        conf = self.app.conf
        user_tasks = [t for name, t in sorted(self.app.tasks.items()) if not name.startswith("celery.")]
        fenced_names = {t.name for t in fenced}
        acks_late = [t for t in user_tasks if getattr(t, "acks_late", False)]

        def hard_limit(task: Any) -> float | None:
            return positive_seconds(getattr(task, "time_limit", None)) or positive_seconds(conf.task_time_limit)

        if scheme in VISIBILITY_DEFAULTS:
            options = conf.broker_transport_options or {}
            vt = positive_seconds(options.get("visibility_timeout")) or VISIBILITY_DEFAULTS[scheme]
            origin = "set" if positive_seconds(options.get("visibility_timeout")) else "default"
            exposed = [t for t in acks_late if (hard_limit(t) or math.inf) >= vt]
            if exposed:
                unfenced = [t.name for t in exposed if t.name not in fenced_names]
                fenced_exposed = [t.name for t in exposed if t.name in fenced_names]
                parts = []
                if unfenced:
                    parts.append(f"unfenced, so both executions write: {join_names(unfenced)}")
                if fenced_exposed:
                    parts.append(
                        f"fenced, so the older execution is fenced out but the work is done twice: "
                        f"{join_names(fenced_exposed)}"
                    )
                self.add(
                    "timing",
                    "warning",
                    f"acks_late tasks without a time limit below the broker's visibility_timeout ({vt:g}s, {origin}): "
                    f"a run that lasts longer is re-delivered to another worker while it still runs ("
                    + "; ".join(parts)
                    + ")",
                    f"set time_limit below {vt:g}s on these tasks (task_time_limit for all), or raise "
                    "broker_transport_options['visibility_timeout'] above your longest task",
                )
            elif acks_late:
                self.add(
                    "timing",
                    "ok",
                    f"every acks_late task has a time limit below the visibility_timeout ({vt:g}s, {origin})",
                )
            delays = self._retry_delays(settings, fenced, user_tasks)
            too_long = sorted((d for d in delays if d[0] >= vt), reverse=True)
            if too_long:
                listed = "; ".join(f"{who}: {delay:g}s" for delay, who in too_long[:5])
                more = f" and {len(too_long) - 5} more" if len(too_long) > 5 else ""
                self.add(
                    "timing",
                    "warning",
                    f"retry delays not below the visibility_timeout ({vt:g}s): {listed}{more}. A message waiting "
                    f"for its ETA/countdown stays unacknowledged on {scheme}, so the broker re-delivers it and the "
                    "task runs twice",
                    f"keep retry delays below {vt:g}s (fencing_retry_max_delay, default_retry_delay, "
                    "retry_backoff_max), or raise the visibility_timeout above the longest delay",
                )
            elif delays:
                longest, who = max(delays)
                self.add(
                    "timing",
                    "ok",
                    f"the longest retry delay ({longest:g}s, {who}) is below the visibility_timeout ({vt:g}s)",
                )
            self.add(
                "timing",
                "note",
                f"ETA and countdown values passed to apply_async() must also stay below the visibility_timeout "
                f"({vt:g}s) on {scheme}; the doctor cannot see those",
                "schedule far-future work with celery beat or a database row, not a long countdown",
            )
        elif scheme in ("amqp", "amqps", "pyamqp", "librabbitmq"):
            limit = RABBITMQ_CONSUMER_TIMEOUT
            exposed = [t.name for t in acks_late if (hard_limit(t) or math.inf) >= limit]
            if exposed:
                self.add(
                    "timing",
                    "note",
                    f"acks_late tasks without a time limit below RabbitMQ's consumer_timeout (30 min by default): "
                    f"{join_names(exposed)}; a delivery unacknowledged for longer closes the channel and is "
                    "re-delivered",
                    "set time_limit below the server's consumer_timeout, or raise consumer_timeout in rabbitmq.conf",
                )
            delays = self._retry_delays(settings, fenced, user_tasks)
            too_long = sorted((d for d in delays if d[0] >= limit), reverse=True)
            if too_long:
                listed = "; ".join(f"{who}: {delay:g}s" for delay, who in too_long[:5])
                self.add(
                    "timing",
                    "note",
                    f"retry delays not below RabbitMQ's consumer_timeout (30 min by default): {listed}. A message "
                    "waiting for its ETA/countdown stays unacknowledged, and past consumer_timeout RabbitMQ closes "
                    "the channel and re-delivers it, again and again",
                    "keep retry delays below the server's consumer_timeout (fencing_retry_max_delay, "
                    "default_retry_delay, retry_backoff_max)",
                )

    def _retry_delays(self, settings: Any, fenced: list[Any], tasks: list[Any]) -> list[tuple[float, str]]:
        delays: list[tuple[float, str]] = []
        if settings is not None:
            for task in fenced:
                own = positive_seconds(getattr(task, "fencing_retry_max_delay", None))
                delay = own or settings.retry_max_delay
                delays.append((delay, f"{task.name} (fencing_retry_max_delay)"))
        for task in tasks:
            default = positive_seconds(getattr(task, "default_retry_delay", None))
            if default:
                delays.append((default, f"{task.name} (default_retry_delay, for self.retry() without countdown)"))
            if getattr(task, "autoretry_for", None) and getattr(task, "retry_backoff", False):
                cap = positive_seconds(getattr(task, "retry_backoff_max", 600)) or 600.0
                delays.append((cap, f"{task.name} (retry_backoff_max)"))
        return delays
