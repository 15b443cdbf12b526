"""Loading a Celery app the way ``celery -A`` does, with an error that says what to fix."""

from __future__ import annotations

from typing import Any

from ...exceptions import FencingConfigurationError

__all__ = ["load_app"]


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
