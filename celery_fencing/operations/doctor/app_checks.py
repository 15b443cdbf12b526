"""The app's own part of the check-up: ``install(app)``, the ``fencing_*`` settings, the fenced tasks."""

from __future__ import annotations

from typing import Any

from ...exceptions import FencingConfigurationError
from .report import Report, join_names

__all__ = ["AppChecks"]


class AppChecks(Report):
    """Checks of the app, its settings and its tasks."""

    def check_app(self) -> Any:
        from ...celery.settings import read_settings

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
        from ...celery.task import FencedTask

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
            self.add("tasks", "ok", f"{len(fenced)} fenced task(s): {join_names(t.name for t in fenced)}")
        else:
            self.add(
                "tasks",
                "warning",
                "no FencedTask is registered: nothing is fenced",
                "point -A at the module that defines your tasks, or list it in the app's imports/include; "
                "fence a task with @app.task(base=FencedTask, ...)",
            )
        return fenced
