"""Reading the app's configuration as the checks need it: positive seconds, and the scheme of a URL.

Both are lenient: a value they cannot read is "not set" (``None``, ``""``),
since reporting a bad setting is the settings check's business.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

__all__ = ["positive_seconds", "url_scheme"]


def positive_seconds(value: Any) -> float | None:
    """*value* as a positive, finite number of seconds, or ``None``."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def url_scheme(url: Any) -> str:
    """The lower-case scheme of *url* (the first of a list, or of a ``;``-separated failover list), or ``""``."""
    if isinstance(url, (list, tuple)):
        url = url[0] if url else None
    if not isinstance(url, str) or not url:
        return ""
    first = url.split(";", 1)[0].strip()
    return urlsplit(first).scheme.lower() if "://" in first else first.lower()
