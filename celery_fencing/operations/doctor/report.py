"""The doctor's findings: one :class:`Check` per line of the report, and the base every area of checks shares.

Statuses: ``ok``; ``note`` (advice, does not fail); ``warning`` and ``error``
(both make the exit code 1). Every finding that is not ``ok`` carries a fix.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["DOCTOR_RESOURCE", "Check", "Report", "Status", "join_names"]

Status = Literal["ok", "note", "warning", "error"]
DOCTOR_RESOURCE = "celery-fencing:doctor"


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


class Report:
    """The findings on one app, so far: what each area of checks adds to.

    :param app: the Celery app under examination.
    :param flags: the worker flags applied to its configuration before the checks (for the report).
    """

    def __init__(self, app: Any, *, flags: list[str] | None = None) -> None:
        self.app = app
        #: The worker flags applied to the app's configuration before the checks (for the report).
        self.flags = list(flags or ())
        self.checks: list[Check] = []

    def add(self, area: str, status: Status, message: str, fix: str = "") -> None:
        """Add one finding."""
        self.checks.append(Check(area, status, message, fix))


def join_names(names: Iterable[str], limit: int = 5) -> str:
    """*names*, sorted, comma-separated, at most *limit* of them and how many more."""
    items = sorted(names)
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
