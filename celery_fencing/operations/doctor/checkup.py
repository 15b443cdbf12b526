"""Doctor: every check of :mod:`celery_fencing.operations.doctor`, in order, on one app."""

from __future__ import annotations

from .app_checks import AppChecks
from .report import Check
from .source_checks import SourceChecks
from .storage_checks import StorageChecks
from .timing_checks import TimingChecks

__all__ = ["Doctor"]


class Doctor(AppChecks, SourceChecks, StorageChecks, TimingChecks):
    """Runs every check on one app. Only the source is written to (two mints on the doctor's resource).

    :param app: the Celery app.
    :param flags: the worker flags applied to its configuration before the checks (for the report).
    """

    # Entry point -------------------------------------------------------------------------

    def run(self) -> list[Check]:
        from ...celery.runtime import runtime_for

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
