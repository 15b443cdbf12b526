"""Validated configuration values: seconds and counts, each checked in one place, with a one-line error."""

from __future__ import annotations

import math
import numbers

from .exceptions import FencingConfigurationError

__all__ = ["count", "number", "seconds"]


def seconds(name: str, value: object, *, zero: bool = False, parse: bool = False) -> float:
    """*value* as a finite number of seconds above 0 (at least 0 with *zero*), else raise.

    A number only (never a bool), unless *parse*: then also a string, as a
    worker flag or a URL parameter gives it.

    :raises FencingConfigurationError: naming *name* and the value.
    """
    bound = "a number of seconds >= 0" if zero else "a positive number of seconds"
    found = _number(value, parse)
    if found is None or not math.isfinite(found) or found < 0 or (found == 0 and not zero):
        raise FencingConfigurationError(f"{name} must be {bound}, not {value!r:.60}")
    return found


def number(name: str, value: object, *, minimum: float = 0.0, parse: bool = False) -> float:
    """*value* as a finite number at least *minimum* (a factor, a fraction), else raise (a bool never passes).

    :raises FencingConfigurationError: naming *name* and the value.
    """
    found = _number(value, parse)
    if found is None or not math.isfinite(found) or found < minimum:
        raise FencingConfigurationError(f"{name} must be a finite number >= {minimum:g}, not {value!r:.60}")
    return found


def count(name: str, value: object, *, minimum: int = 0, parse: bool = False) -> int:
    """*value* as a whole number at least *minimum*, else raise (an integral float passes; a bool never does).

    :raises FencingConfigurationError: naming *name* and the value.
    """
    found = _number(value, parse)
    if found is None or not math.isfinite(found) or not found.is_integer() or found < minimum:
        raise FencingConfigurationError(f"{name} must be a whole number >= {minimum}, not {value!r:.60}")
    return int(found)


def _number(value: object, parse: bool) -> float | None:
    """*value* as a float: from a real number, or (with *parse*) a string; ``None`` when it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        try:
            return float(value)
        except OverflowError:
            return math.inf
    if parse and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None
