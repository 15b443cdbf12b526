"""``python -m celery_fencing.testing.launcher APP [worker options]``: ``celery -A APP worker``, set up for a test.

What :class:`~celery_fencing.testing.FencedWorker` runs. Before the worker
starts it applies the test's settings to the user's app (JSON in
:data:`SETTINGS_ENV_VAR`; a dict-valued setting such as
``broker_transport_options`` is merged into the app's own) and, when
:data:`celery_fencing.testing.events.ENV_VAR` names a file, records the
fencing signals there. The user's app module is imported as ``celery -A``
would, and is not changed: production configuration stays where it is.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from . import events

__all__ = ["SETTINGS_ENV_VAR", "apply_settings", "main"]

#: The environment variable holding the test's settings for the app, as a JSON object.
SETTINGS_ENV_VAR = "CELERY_FENCING_WORKER_SETTINGS"


def apply_settings(app: Any, settings: dict[str, Any]) -> None:
    """Update *app*'s configuration with *settings*, merging dict values into the app's own dicts."""
    for name, value in settings.items():
        current = app.conf.get(name)
        if isinstance(value, dict) and isinstance(current, dict):
            value = {**current, **value}
        app.conf[name] = value


def main(argv: list[str] | None = None) -> int:
    """Run the worker; *argv* is ``APP`` followed by ``celery worker`` options."""
    from celery.app.utils import find_app

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        print("usage: python -m celery_fencing.testing.launcher APP [celery worker options]", file=sys.stderr)
        return 2
    app_path, worker_args = args[0], args[1:]
    app = find_app(app_path)
    settings = json.loads(os.environ.get(SETTINGS_ENV_VAR) or "{}")
    if not isinstance(settings, dict):
        print(f"{SETTINGS_ENV_VAR} must be a JSON object, not {settings!r:.60}", file=sys.stderr)
        return 2
    apply_settings(app, settings)
    if os.environ.get(events.ENV_VAR):
        events.record_events(os.environ[events.ENV_VAR])
    app.start(["-A", app_path, "worker", *worker_args])
    return 0


if __name__ == "__main__":
    sys.exit(main())
