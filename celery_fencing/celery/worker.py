"""Worker integration: ``install(app)`` adds the ``--fencing-*`` flags and a bootstep.

What ``install`` wires, and why:

* One ``click`` option per setting in :data:`~celery_fencing.celery.settings.SETTINGS`,
  shown by ``celery worker --help``. A flag given on the command line is
  written into ``app.conf`` by the bootstep's constructor, which runs before the
  pool forks, so prefork children inherit it (flags win over settings).
* The bootstep validates every setting at start: a worker with a bad setting
  refuses to start, naming it, instead of failing every task later.
* Token sources are per process. prefork: each child opens its own in
  ``worker_process_init`` (bounded by ``fencing_timeout``, well inside the pool's
  4 s ``worker_proc_alive_timeout`` by default) and closes it at
  ``worker_process_shutdown``. solo, threads, gevent: the bootstep opens one
  source in the worker process, shared by its threads, and closes it at stop.
  A failed early open is logged, not raised: a raising child would be
  restarted in a loop; tasks then retry until the source is back.

It uses public Celery hooks only, and every signal handler is connected with
``weak=False`` and has a matching disconnect in :func:`uninstall`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, ClassVar

from celery import bootsteps
from celery.bin.base import CeleryOption
from celery.signals import worker_process_init, worker_process_shutdown

from ..exceptions import FencingConfigurationError, FencingError, TokenUnavailableError
from ..protocols import LeasingSource, LockDelaySource, conforms
from .runtime import runtime_for
from .settings import SETTINGS

__all__ = ["FencingBootstep", "install", "uninstall"]

logger = logging.getLogger("celery_fencing")

_INSTALLED_ATTR = "_celery_fencing_installed"


class FencingBootstep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Applies ``--fencing-*`` flags, validates settings, owns the worker process's source."""

    label = "celery-fencing"
    requires: ClassVar[set[str]] = {"celery.worker.components:Pool"}

    def __init__(self, parent: Any, **options: Any) -> None:
        super().__init__(parent, **options)
        try:
            self._configure(parent, options)
        except FencingConfigurationError as exc:
            # One line that names the setting, flag or task; the traceback only says where in
            # Celery's start-up this ran. At DEBUG it is shown, for whoever debugs the library.
            if logging.getLogger().isEnabledFor(logging.DEBUG):
                raise
            raise SystemExit(f"celery-fencing: the worker cannot start: {exc}") from None

    def _configure(self, parent: Any, options: dict[str, Any]) -> None:
        app = parent.app
        for setting in SETTINGS:
            value = options.get(setting.name)
            if value is not None and not (setting.is_flag and value is False):
                app.conf[setting.name] = value
        # Fail the worker's start on a bad or missing setting, naming it.
        settings = runtime_for(app).reload_settings()
        if settings.source is None:
            raise FencingConfigurationError(
                "celery-fencing is installed but no token source is configured: set fencing_source "
                "(e.g. 'zookeeper://127.0.0.1:2181/fencing') or pass --fencing-source URL"
            )
        self.app = app
        # Build the source once now, so a malformed URL or a volatile source stops
        # the start. Close it again before the pool forks: clients must not cross
        # fork(). A grantor that is merely down is no reason to refuse to start.
        runtime = runtime_for(app)
        try:
            source = runtime.source()
            _check_source_supports(source, settings)
            if getattr(source, "volatile", False) and _is_prefork(parent) and int(parent.concurrency or 1) > 1:
                logger.warning(
                    "%s with a prefork pool of %s processes: every child counts from its own zero, so tokens "
                    "of different children are not ordered and fence nothing between them (tests only; "
                    "use sqlite:// or zookeeper://, or a solo or threads pool)",
                    type(source).__name__,
                    parent.concurrency,
                )
        except TokenUnavailableError as exc:
            logger.warning("fencing token source unavailable at worker start: %s", exc)
        finally:
            runtime.close()

    def start(self, parent: Any) -> None:
        if _is_prefork(parent):
            return  # each child opens its own source (worker_process_init)
        _open_source(self.app)

    def stop(self, parent: Any) -> None:
        runtime_for(self.app).close()

    # The embedded test worker (celery.contrib.testing) calls terminate, not stop.
    terminate = stop


def _check_source_supports(source: Any, settings: Any) -> None:
    """Refuse to start when the worker-wide settings ask for what the source cannot do.

    Otherwise every task would fail at run time with the same configuration error.
    (Per-task options are checked when the task runs.)
    """
    if settings.mode == "exclusive" and not conforms(source, LeasingSource):
        raise FencingConfigurationError(
            f"fencing_mode='exclusive' needs a source with leases (ZooKeeper, etcd), not {type(source).__name__}"
        )
    if settings.lock_delay and not conforms(source, LockDelaySource):
        raise FencingConfigurationError(
            f"fencing_lock_delay={settings.lock_delay:g} needs a source whose leases take a lock-delay "
            f"(ZooKeeper), not {type(source).__name__}; set it to 0 or use zookeeper://"
        )


def _is_prefork(worker: Any) -> bool:
    pool_cls = getattr(worker, "pool_cls", None)
    name = getattr(pool_cls, "__module__", "") + "." + getattr(pool_cls, "__name__", str(pool_cls))
    return "prefork" in name


def _open_source(app: Any) -> None:
    runtime = runtime_for(app)
    try:
        source = runtime.source()
        connect = getattr(source, "connect", None)
        if connect is not None:
            # Connect now so a session exists (and its state is watched) before the
            # first task; stay well inside prefork's 4 s worker_proc_alive_timeout.
            connect(timeout=min(runtime.settings().timeout, 3.0))
    except FencingError as exc:
        logger.error("fencing token source could not be opened: %s; tasks will retry until it can", exc)


class _FencingOption(CeleryOption):  # type: ignore[misc]
    """A ``--fencing-*`` worker flag, listed under its own heading in ``celery worker --help``, in table order.

    Celery keeps user options in a set and lists them in the set's order; an
    object's default hash is its address, so the flags came out in a new order
    on every run. A hash that is the flag's position in the settings table
    keeps them in that order (a small int hashes to itself, and a set lists
    small ints in order).
    """

    def __init__(self, position: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, help_group="Fencing Options", **kwargs)
        self._position = position

    def __hash__(self) -> int:
        return self._position


def _install_one_line_errors() -> None:
    """Print an uncaught FencingConfigurationError as one line, not a traceback through Celery's start-up.

    A task-option typo is found when Celery creates the task's class, deep in
    the worker's start, and the traceback (some 50 lines) ends with the one
    line that matters. Only this library's configuration errors are shortened,
    and not when CELERY_FENCING_TRACEBACK=1 or the root logger is at DEBUG;
    every other exception goes to the hook that was there before.
    """
    previous = sys.excepthook
    if getattr(previous, "_celery_fencing", False):
        return

    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        wanted = os.environ.get("CELERY_FENCING_TRACEBACK") == "1" or logging.getLogger().isEnabledFor(logging.DEBUG)
        if issubclass(exc_type, FencingConfigurationError) and not wanted:
            sys.stderr.write(f"celery-fencing: {exc}\n")
            return
        previous(exc_type, exc, tb)

    hook._celery_fencing = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def install(app: Any) -> Any:
    """Add the ``--fencing-*`` worker flags, the bootstep and the per-process hooks to *app*.

    Idempotent. Returns *app*, so ``app = install(Celery(...))`` reads well.
    """
    if getattr(app, _INSTALLED_ATTR, False):
        return app
    for position, setting in enumerate(SETTINGS):
        if setting.is_flag:
            option = _FencingOption(position, [setting.flag], is_flag=True, default=None, help=setting.help)
        else:
            option = _FencingOption(position, [setting.flag], default=None, metavar=setting.metavar, help=setting.help)
        app.user_options["worker"].add(option)
    app.steps["worker"].add(FencingBootstep)

    def on_process_init(**_: Any) -> None:
        _open_source(app)

    def on_process_shutdown(**_: Any) -> None:
        runtime_for(app).close()

    _install_one_line_errors()
    worker_process_init.connect(on_process_init, weak=False)
    worker_process_shutdown.connect(on_process_shutdown, weak=False)
    app._celery_fencing_handlers = (on_process_init, on_process_shutdown)
    setattr(app, _INSTALLED_ATTR, True)
    return app


def uninstall(app: Any) -> None:
    """Undo :func:`install`'s signal connections (flags and bootstep stay registered)."""
    handlers = getattr(app, "_celery_fencing_handlers", None)
    if handlers:
        worker_process_init.disconnect(handlers[0])
        worker_process_shutdown.disconnect(handlers[1])
    runtime_for(app).close()
    setattr(app, _INSTALLED_ATTR, False)
