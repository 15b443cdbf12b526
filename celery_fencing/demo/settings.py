"""What one demo run uses, passed from the runner to its workers through environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from ..exceptions import FencingConfigurationError

__all__ = ["ENV_PREFIX", "DemoSettings"]

ENV_PREFIX = "CELERY_FENCING_DEMO_"


@dataclass(frozen=True)
class DemoSettings:
    """Everything the demo's Celery app needs to know; one instance per demo run.

    :param directory: the run's temporary directory (event log, broker folders,
        results, SQLite files, worker logs).
    :param namespace: unique per run: prefixes queue names, Redis keys and SQL
        tables, so runs on shared servers never meet.
    :param broker: broker URL; ``filesystem://`` uses folders in *directory*.
    :param source: token source URL.
    :param store: where the account lives: ``sqlite:///...``,
        ``postgresql+psycopg://...`` or ``redis://...``.
    """

    directory: str
    namespace: str
    broker: str
    source: str
    store: str

    @property
    def events_path(self) -> Path:
        return Path(self.directory) / "events.jsonl"

    @property
    def results_url(self) -> str:
        # Celery's file:// result backend: no server, one file per result.
        return "file://" + str(Path(self.directory) / "results")

    def queue(self, worker: str) -> str:
        """The queue only *worker* consumes, so the runner decides who runs what."""
        return f"{self.namespace}-{worker.lower()}"

    def go_path(self, task_id: str) -> Path:
        """The file that lets a held task go on past its read (see the demo app)."""
        return Path(self.directory) / f"go-{task_id}"

    def to_env(self) -> dict[str, str]:
        return {ENV_PREFIX + field.name.upper(): str(getattr(self, field.name)) for field in fields(self)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DemoSettings:
        """Read the settings the runner put in the environment.

        :raises FencingConfigurationError: naming a missing variable (the app
            was started by hand, not by ``celery-fencing demo``).
        """
        env = os.environ if environ is None else environ
        values: dict[str, str] = {}
        for field in fields(cls):
            name = ENV_PREFIX + field.name.upper()
            if not env.get(name):
                raise FencingConfigurationError(
                    f"{name} is not set: celery_fencing.demo.app is started by `celery-fencing demo`, not by hand"
                )
            values[field.name] = env[name]
        return cls(**values)
