"""``celery-fencing doctor -A proj``: check a Celery app's fencing setup, and say how to fix it.

What is checked, in order:

* **app**: ``install(app)`` was called; the ``fencing_*`` settings are valid;
  fenced tasks are registered (after importing ``imports``/``include``).
* **source**: configured, reachable, and monotonic: two tokens are minted on the
  doctor's own resource (``celery-fencing:doctor``) and the second must be larger.
* **zookeeper**, **etcd**: ensemble size from the URL; ZooKeeper's session
  timeout against ``fencing_timeout`` and its negotiation bounds; etcd's
  ``lease_ttl`` against ``fencing_timeout`` in exclusive mode.
* **gates**: every gate of every fenced task answers (a mark read on the
  doctor's resource, nothing written); a Redis gate's persistence (``CONFIG GET
  appendonly``/``save``): a store without persistence forgets marks on restart.
* **results**: the result backend, and the persistence of a ``fenced+redis://`` one.
* **broker** and **timing**: the broker answers; settings that make the broker
  re-deliver a task while it still runs: ``visibility_timeout`` (Redis, SQS)
  against task time limits for ``acks_late`` tasks, and against the longest
  retry delay (a message waiting for its ETA or countdown stays unacknowledged);
  RabbitMQ's ``consumer_timeout``.

Every finding carries a concrete fix. Statuses: ``ok``; ``note`` (advice, does
not fail); ``warning`` and ``error`` (both make the exit code 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from ..exceptions import FencingConfigurationError, FencingError, TokenUnavailableError
from .urls import redact

__all__ = ["DOCTOR_RESOURCE", "Check", "Doctor", "load_app"]

Status = Literal["ok", "note", "warning", "error"]
DOCTOR_RESOURCE = "celery-fencing:doctor"
#: Default visibility timeouts of kombu's transports that have one, in seconds.
VISIBILITY_DEFAULTS = {"redis": 3600.0, "rediss": 3600.0, "sentinel": 3600.0, "sqs": 1800.0}
#: RabbitMQ's default consumer_timeout (since 3.8.15), in seconds.
RABBITMQ_CONSUMER_TIMEOUT = 1800.0
#: ZooKeeper negotiates session timeouts within [2, 20] x tickTime; tickTime defaults to 2000 ms.
ZOOKEEPER_MIN_SESSION = 4.0


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    area: str
    status: Status
    message: str
    fix: str = ""

    @property
    def failing(self) -> bool:
        return self.status in ("warning", "error")

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def load_app(spec: str) -> Any:
    """Load a Celery app the way ``celery -A`` does (``module``, ``module:attr``, ``module.attr``).

    :raises FencingConfigurationError: naming what could not be imported or found.
    """
    from celery import Celery
    from celery.app.utils import find_app

    try:
        app = find_app(spec)
    except ModuleNotFoundError as exc:
        raise FencingConfigurationError(
            f"cannot load the app {spec!r}: no module named {exc.name!r} (run from your project directory, "
            "or put it on PYTHONPATH)"
        ) from exc
    except AttributeError as exc:
        hint = "" if ":" in spec else " (no attribute 'app' or 'celery' in it: name the app, -A module:attribute)"
        raise FencingConfigurationError(f"cannot load the app {spec!r}: {exc}{hint}") from exc
    except ImportError as exc:
        raise FencingConfigurationError(f"cannot load the app {spec!r}: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise FencingConfigurationError(
            f"importing the app {spec!r} raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    if not isinstance(app, Celery):
        raise FencingConfigurationError(f"{spec!r} is a {type(app).__name__}, not a Celery app")
    return app


def _seconds(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def _scheme(url: Any) -> str:
    if isinstance(url, (list, tuple)):
        url = url[0] if url else None
    if not isinstance(url, str) or not url:
        return ""
    first = url.split(";", 1)[0].strip()
    return urlsplit(first).scheme.lower() if "://" in first else first.lower()


def _join(names: Iterable[str], limit: int = 5) -> str:
    items = sorted(names)
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


class Doctor:
    """Runs every check on one app. Only the source is written to (two mints on the doctor's resource)."""

    def __init__(self, app: Any, *, flags: list[str] | None = None) -> None:
        self.app = app
        #: The worker flags applied to the app's configuration before the checks (for the report).
        self.flags = list(flags or ())
        self.checks: list[Check] = []

    def add(self, area: str, status: Status, message: str, fix: str = "") -> None:
        self.checks.append(Check(area, status, message, fix))

    # Entry point -------------------------------------------------------------------------

    def run(self) -> list[Check]:
        from ..celery.runtime import runtime_for

        settings = self.check_app()
        tasks = self.check_tasks()
        if settings is not None:
            source = self.check_source(settings)
            if source is not None:
                self.check_grantor(source, settings, tasks)
        self.check_gates(tasks)
        self.check_results(tasks)
        self.check_broker()
        self.check_timing(settings, tasks)
        runtime_for(self.app).close()
        return self.checks

    # App and settings ------------------------------------------------------------------------

    def check_app(self) -> Any:
        from ..celery.settings import read_settings

        if getattr(self.app, "_celery_fencing_installed", False):
            self.add("app", "ok", f"celery_fencing.celery.install() was called on app {self.app.main!r}")
        else:
            self.add(
                "app",
                "warning",
                "install(app) was not called: workers get no --fencing-* flags, do not check the settings at start, "
                "and prefork children do not open their token source early",
                "from celery_fencing.celery import install; app = install(Celery(...))",
            )
        try:
            settings = read_settings(self.app.conf)
        except FencingConfigurationError as exc:
            self.add("settings", "error", str(exc), "correct the setting (docs: Configuration reference)")
            return None
        given = f" (with the worker flags {', '.join(self.flags)})" if self.flags else ""
        self.add("settings", "ok", f"every fencing_* setting is valid{given}")
        return settings

    def check_tasks(self) -> list[Any]:
        from ..celery.task import FencedTask

        try:
            self.app.loader.import_default_modules()
        except Exception as exc:
            self.add(
                "tasks",
                "error",
                f"importing the app's task modules (imports/include) failed: {type(exc).__name__}: {exc}",
                "fix the import error; workers would fail the same way",
            )
        fenced = [task for name, task in sorted(self.app.tasks.items()) if isinstance(task, FencedTask)]
        if fenced:
            self.add("tasks", "ok", f"{len(fenced)} fenced task(s): {_join(t.name for t in fenced)}")
        else:
            self.add(
                "tasks",
                "warning",
                "no FencedTask is registered: nothing is fenced",
                "point -A at the module that defines your tasks, or list it in the app's imports/include; "
                "fence a task with @app.task(base=FencedTask, ...)",
            )
        return fenced

    # Token source ------------------------------------------------------------------------------

    def check_source(self, settings: Any) -> Any:
        from ..celery.runtime import runtime_for

        if settings.source is None:
            self.add(
                "source",
                "error",
                "no token source: fencing_source is not set",
                "app.conf.fencing_source = 'zookeeper://zk1:2181,zk2:2181,zk3:2181/fencing' "
                "(or pass --fencing-source to every worker)",
            )
            return None
        shown = redact(settings.source) if isinstance(settings.source, str) else type(settings.source).__name__
        try:
            source = runtime_for(self.app).source()
        except FencingConfigurationError as exc:
            self.add("source", "error", str(exc), "use zookeeper:// (several hosts) or sqlite:// (one host)")
            return None
        try:
            first = source.mint(DOCTOR_RESOURCE, timeout=settings.timeout)
            second = source.mint(DOCTOR_RESOURCE, timeout=settings.timeout)
        except TokenUnavailableError as exc:
            self.add(
                "source",
                "error",
                f"{shown} is unreachable: {exc}",
                "check the hosts and that the servers run; workers cannot start fenced tasks without it "
                "(they retry, then fail)",
            )
            return None
        except FencingError as exc:
            self.add("source", "error", f"{shown} failed to mint: {exc}", "check the source URL and its server")
            return None
        if second.value <= first.value:
            self.add(
                "source",
                "error",
                f"{shown} is not monotonic: minted {first.value} then {second.value}",
                "tokens must strictly increase: use zookeeper:// or sqlite://, never a clock or a resettable counter",
            )
            return source
        self.add("source", "ok", f"{shown} answers and is monotonic: minted {first.value} then {second.value}")
        if getattr(source, "volatile", False):
            self.add(
                "source",
                "error",
                f"{type(source).__name__} is volatile: a restart resets its counter below the marks the gates hold",
                "use zookeeper:// or sqlite://; keep memory:// for tests (fencing_allow_volatile_source)",
            )
        elif type(source).__name__ == "SQLiteTokenSource":
            self.add(
                "source",
                "note",
                "a SQLite token source is one file on one host: workers on other hosts would mint from their own "
                "file, and their tokens would not be ordered against these",
                "run every worker on this host, or use zookeeper:// for several hosts",
            )
        return source

    def check_ensemble(self, area: str, kind: str, hosts: list[str]) -> None:
        count = len(hosts)
        if count == 1:
            self.add(
                area,
                "warning",
                f"one {kind} server ({hosts[0]}): when it is down no token can be minted and fenced tasks stop",
                "run 3 servers (tolerates 1 failure) or 5 (tolerates 2), and list every one in the URL",
            )
        elif count % 2 == 0:
            self.add(
                area,
                "note",
                f"{count} {kind} servers listed: an even ensemble tolerates no more failures than one server fewer",
                f"use {count - 1} or {count + 1} servers",
            )
        else:
            self.add(area, "ok", f"{count} {kind} servers listed (a quorum survives {count // 2} failures)")

    def check_grantor(self, source: Any, settings: Any, tasks: list[Any]) -> None:
        kind = type(source).__name__
        exclusive = settings.mode == "exclusive" or any(getattr(t, "fencing_mode", None) == "exclusive" for t in tasks)
        if kind == "EtcdTokenSource":
            self.check_ensemble("etcd", "etcd", list(getattr(source, "endpoints", ())))
            ttl = getattr(source, "lease_ttl", None)
            if exclusive and ttl is not None and settings.timeout >= ttl:
                self.add(
                    "etcd",
                    "warning",
                    f"fencing_timeout={settings.timeout:g}s is not below the etcd lease_ttl ({ttl:g}s): a task can "
                    "wait for a lock longer than a dead holder keeps it",
                    f"set fencing_timeout below lease_ttl, e.g. {ttl / 2:g}, or raise ?lease_ttl= in the URL",
                )
            return
        if kind == "ZooKeeperTokenSource":
            self.check_zookeeper(source, settings, exclusive)

    def check_zookeeper(self, source: Any, settings: Any, exclusive: bool) -> None:
        session = float(source.session_timeout)
        hosts = getattr(source, "hosts", None)
        if isinstance(hosts, str):
            self.check_ensemble("zookeeper", "ZooKeeper", [h.strip() for h in hosts.split(",") if h.strip()])
        if session < ZOOKEEPER_MIN_SESSION:
            self.add(
                "zookeeper",
                "warning",
                f"session_timeout={session:g}s is below what ZooKeeper grants (2 x tickTime, 4 s by default): "
                "the server silently raises it",
                "ask for session_timeout=10 or more in the source URL (?session_timeout=10)",
            )
        if settings.timeout >= session:
            self.add(
                "zookeeper",
                "warning",
                f"fencing_timeout={settings.timeout:g}s is not below the ZooKeeper session timeout ({session:g}s): "
                "a mint can wait out a whole session expiry, and in exclusive mode the lease it waits for may "
                "already belong to another worker",
                f"set fencing_timeout below the session timeout, e.g. {session / 2:g}, or raise ?session_timeout=",
            )
        else:
            self.add(
                "zookeeper",
                "ok",
                f"fencing_timeout={settings.timeout:g}s is below the session timeout ({session:g}s)",
            )
        if exclusive and not settings.abort_on_session_loss:
            self.add(
                "zookeeper",
                "note",
                "exclusive mode without fencing_abort_on_session_loss: a task whose session was lost keeps running "
                "until its next gate write is refused",
                "set fencing_abort_on_session_loss = True to stop it at its next gate call",
            )

    # Gates and results -----------------------------------------------------------------------

    def check_gates(self, tasks: list[Any]) -> None:
        from ..celery.runtime import runtime_for

        seen: dict[int, tuple[Any, list[str]]] = {}
        without: list[str] = []
        for task in tasks:
            try:
                gates = runtime_for(self.app).gates(task)
            except Exception as exc:
                self.add(
                    "gates",
                    "error",
                    f"building the gates of task {task.name} raised {type(exc).__name__}: {exc}",
                    "fix the fencing_gates factory; workers would fail the same way",
                )
                continue
            if not gates:
                without.append(task.name)
            for gate in gates:
                seen.setdefault(id(gate), (gate, []))[1].append(task.name)
        if without:
            self.add(
                "gates",
                "note",
                f"claiming no gate when they start: {_join(without)}. Their writes through a gate are still fenced, "
                "but a read-modify-write in them is not: a paused older execution can write between their read "
                "and their write",
                "give such tasks fencing_gates=[...] naming the gates their data lives behind",
            )
        for gate, users in seen.values():
            label = describe_gate(gate)
            try:
                gate.high_water(DOCTOR_RESOURCE)
            except FencingError as exc:
                self.add(
                    "gates",
                    "error",
                    f"{label} (used by {_join(users)}) cannot be read: {exc}",
                    "check that the server runs and the URL and credentials are right"
                    + (
                        "; create the mark table if it is missing (gate.create_schema(), or high_water_table() "
                        "in your migrations)"
                        if type(gate).__name__ == "SQLGate"
                        else ""
                    ),
                )
                continue
            self.add("gates", "ok", f"{label} answers (used by {_join(users)})")
            client = getattr(gate, "client", None)
            if type(gate).__name__ == "RedisGate" and client is not None:
                self.check_redis_persistence(f"gate {label}", client)

    def check_redis_persistence(self, what: str, client: Any) -> None:
        try:
            aof = _config(client, "appendonly")
            save = _config(client, "save")
            fsync = _config(client, "appendfsync")
        except Exception as exc:
            self.add(
                "persistence",
                "note",
                f"cannot read the persistence settings of {what} ({type(exc).__name__}: {exc})",
                "check with your provider that AOF persistence is on: without it a restart forgets the marks",
            )
            return
        if aof == "yes":
            if fsync == "no":
                self.add(
                    "persistence",
                    "note",
                    f"{what}: AOF is on with appendfsync no: the OS decides when marks reach the disk",
                    "CONFIG SET appendfsync everysec (or always), and the same in redis.conf",
                )
            else:
                self.add("persistence", "ok", f"{what}: AOF persistence is on (appendfsync {fsync})")
            return
        fix = "CONFIG SET appendonly yes, and appendonly yes in redis.conf so it survives a restart"
        if save:
            self.add(
                "persistence",
                "warning",
                f"{what}: RDB snapshots only (save {save!r}): a restart rolls the marks back to the last snapshot, "
                "and a stale execution whose token is above the restored mark is accepted again",
                fix,
            )
        else:
            self.add(
                "persistence",
                "warning",
                f"{what}: no persistence (appendonly no, save ''): a restart forgets every mark, and a stale "
                "token is accepted again. That is harmless only if all the data the marks guard lives in this "
                "same Redis and is lost with them",
                fix,
            )

    def check_results(self, tasks: list[Any]) -> None:
        backend_url = self.app.conf.result_backend
        scheme = _scheme(backend_url)
        with_results = [t.name for t in tasks if not getattr(t, "ignore_result", False)]
        if scheme.startswith("fenced+"):
            self.add("results", "ok", "fenced result backend: a stale execution's result is dropped, never stored")
            try:
                client = self.app.backend.client
            except Exception as exc:
                self.add("results", "error", f"the fenced result backend cannot be built: {exc}", "check its URL")
                return
            self.check_redis_persistence("result backend", client)
        elif scheme in ("redis", "rediss") and with_results:
            self.add(
                "results",
                "warning",
                f"result_backend is plain {scheme}://: the result of a stale execution can overwrite the newer "
                f"execution's result (tasks: {_join(with_results)})",
                f"result_backend = 'fenced+{redact(str(backend_url))}' (same options as the Redis backend)",
            )
        elif scheme and scheme != "disabled" and with_results:
            self.add(
                "results",
                "note",
                f"result backend {scheme}:// is not fenced: a stale execution's result can overwrite a newer one",
                "only Redis has a fenced backend (fenced+redis://); or set ignore_result=True on fenced tasks",
            )

    # Broker and re-delivery timing ---------------------------------------------------------------

    def broker_scheme(self) -> str:
        return _scheme(self.app.conf.broker_url) or "amqp"

    def check_broker(self) -> None:
        shown = redact(str(self.app.conf.broker_url or "amqp://guest@localhost//"))
        try:
            with self.app.connection_for_write(connect_timeout=5) as conn:
                conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=5)
        except ImportError as exc:
            self.add(
                "broker",
                "error",
                f"the transport for broker {shown} cannot be loaded: {exc}",
                f"install the transport's dependencies, e.g. pip install 'celery[{self.broker_scheme()}]'",
            )
            return
        except Exception as exc:
            self.add("broker", "error", f"broker {shown} is unreachable: {exc}", "check broker_url and the server")
            return
        self.add("broker", "ok", f"broker {shown} answers")

    def check_timing(self, settings: Any, fenced: list[Any]) -> None:
        scheme = self.broker_scheme()
        conf = self.app.conf
        user_tasks = [t for name, t in sorted(self.app.tasks.items()) if not name.startswith("celery.")]
        fenced_names = {t.name for t in fenced}
        acks_late = [t for t in user_tasks if getattr(t, "acks_late", False)]

        def hard_limit(task: Any) -> float | None:
            return _seconds(getattr(task, "time_limit", None)) or _seconds(conf.task_time_limit)

        if scheme in VISIBILITY_DEFAULTS:
            options = conf.broker_transport_options or {}
            vt = _seconds(options.get("visibility_timeout")) or VISIBILITY_DEFAULTS[scheme]
            origin = "set" if _seconds(options.get("visibility_timeout")) else "default"
            exposed = [t for t in acks_late if (hard_limit(t) or math.inf) >= vt]
            if exposed:
                unfenced = [t.name for t in exposed if t.name not in fenced_names]
                fenced_exposed = [t.name for t in exposed if t.name in fenced_names]
                parts = []
                if unfenced:
                    parts.append(f"unfenced, so both executions write: {_join(unfenced)}")
                if fenced_exposed:
                    parts.append(
                        f"fenced, so the older execution is fenced out but the work is done twice: "
                        f"{_join(fenced_exposed)}"
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
                    f"{_join(exposed)}; a delivery unacknowledged for longer closes the channel and is re-delivered",
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
                own = _seconds(getattr(task, "fencing_retry_max_delay", None))
                delay = own or settings.retry_max_delay
                delays.append((delay, f"{task.name} (fencing_retry_max_delay)"))
        for task in tasks:
            default = _seconds(getattr(task, "default_retry_delay", None))
            if default:
                delays.append((default, f"{task.name} (default_retry_delay, for self.retry() without countdown)"))
            if getattr(task, "autoretry_for", None) and getattr(task, "retry_backoff", False):
                cap = _seconds(getattr(task, "retry_backoff_max", 600)) or 600.0
                delays.append((cap, f"{task.name} (retry_backoff_max)"))
        return delays


def _config(client: Any, name: str) -> str:
    reply = client.config_get(name)
    value = reply.get(name, reply.get(name.encode(), ""))
    return value.decode() if isinstance(value, bytes) else str(value)


def describe_gate(gate: Any) -> str:
    """A short, password-free name for a gate: its kind, server and namespace."""
    kind = type(gate).__name__
    if kind == "RedisGate":
        kwargs = getattr(getattr(gate.client, "connection_pool", None), "connection_kwargs", {})
        where = f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
        if "path" in kwargs:
            where = str(kwargs["path"])
        return f"RedisGate redis://{where} prefix={gate.prefix!r}"
    if kind == "SQLGate":
        url = gate.engine.url.render_as_string(hide_password=True)
        return f"SQLGate {url} table={gate.table.name!r}"
    return kind
