"""``celery-fencing rebase`` and ``celery-fencing repair``: the two audited ways to move a mark by hand.

Both bypass the one rule gates otherwise never break (a mark only goes up,
and only for its own grantor), so both are deliberate: they print every
change before making it, change nothing without ``--yes``, log each change
on the ``celery_fencing.audit`` logger (WARNING), and set each mark with a
compare-and-set on the mark the operator was shown (a mark that moved in
between is left alone and reported).

* **rebase** moves resources to the source's current grantor: a mark held by
  another grantor (a ZooKeeper whose data directory was wiped, a new SQLite
  file) is set to a token freshly minted by the source, with the source's
  grantor id. Every token of the old grantor is refused from then on (it is
  another grantor's), and every token the new grantor minted before the
  rebase is below the new mark.
* **repair** lowers a *poisoned* mark: one of the source's own grantor (or of
  none) that is above a token freshly minted for the resource, which no
  honest token can be (a forged or corrupted 2**63-1, or a grantor reset that
  kept its id). The mark is set to the fresh token: every token minted
  before it stays refused, and the next one passes.

Neither touches a mark that needs no change. The fresh token is minted once
per resource, after the marks were read, so it is above every token the
grantor issued before the command ran.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..exceptions import FencingConfigurationError, FencingError, InvalidTokenError
from ..protocols import TokenSource
from ..token import FencingToken, Mark, validate_resource
from ..urls import redact_url
from .urls import OpenedGate

__all__ = ["AUDIT_LOGGER", "MarkChange", "apply_changes", "open_admin_source", "plan_rebase", "plan_repair"]

#: Every mark changed by hand is logged here, at WARNING.
AUDIT_LOGGER = "celery_fencing.audit"

audit = logging.getLogger(AUDIT_LOGGER)


@dataclass
class MarkChange:
    """One mark at one gate, what the command found and what it will set (or did, or could not)."""

    resource: str
    gate: OpenedGate
    before: Mark | None
    reason: str
    after: FencingToken | None = None
    outcome: str = "planned"

    def describe(self) -> str:
        before = "no mark" if self.before is None else _mark_text(self.before)
        after = "a fresh token" if self.after is None else f"{self.after.value} (grantor {self.after.grantor})"
        return f"{self.resource} @ {self.gate.label}: {before} -> {after}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "gate": self.gate.label,
            "before": None if self.before is None else {"value": self.before.value, "grantor": self.before.grantor},
            "after": None if self.after is None else {"value": self.after.value, "grantor": self.after.grantor},
            "reason": self.reason,
            "outcome": self.outcome,
        }


def _mark_text(mark: Mark) -> str:
    return f"mark {mark.value} (grantor {mark.grantor or 'none recorded'})"


def open_admin_source(url: str) -> TokenSource:
    """The token source *url* names, for minting the fresh tokens; a SQLite file must already exist.

    :raises FencingConfigurationError: malformed URL, unknown scheme, missing
        file, or a source that has no grantor id (memory://).
    """
    from ..sources import token_source_from_url
    from ..urls import split_url

    if not isinstance(url, str) or "://" not in url:
        raise FencingConfigurationError(
            f"token source URL must look like 'zookeeper://host:2181/root' or 'sqlite:///tokens.db', got {url!r}"
        )
    parts = split_url(url, "token source URL")
    scheme = parts.scheme.lower()
    if scheme == "memory":
        raise FencingConfigurationError("memory:// lives inside one process: there is no grantor to rebase onto")
    if scheme == "sqlite":
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path or not Path(path).is_file():
            raise FencingConfigurationError(
                f"token database {path!r} does not exist: an operator command does not create a new grantor"
            )
    source = token_source_from_url(url)
    if not callable(getattr(source, "grantor_id", None)):
        source.close()
        raise FencingConfigurationError(f"{redact_url(url)!r} names a source without a grantor id")
    return source


def _check_resources(resources: list[str]) -> None:
    for resource in resources:
        try:
            validate_resource(resource)
        except InvalidTokenError as exc:
            raise FencingConfigurationError(f"bad resource name {resource!r}: {exc}") from exc


def _read_mark(opened: OpenedGate, resource: str) -> Mark | None:
    read = getattr(opened.gate, "mark", None)
    if read is None or not callable(getattr(opened.gate, "reset_mark", None)):
        raise FencingConfigurationError(f"the gate at {opened.label} cannot have its marks reset")
    try:
        mark: Mark | None = read(resource)
    except FencingError as exc:
        raise FencingConfigurationError(f"cannot read the mark of {resource!r} at {opened.label}: {exc}") from exc
    return mark


def plan_rebase(grantor: str, gates: list[OpenedGate], resources: list[str]) -> list[MarkChange]:
    """The marks that belong to another grantor than *grantor* (the source's), one change each.

    :raises FencingConfigurationError: a bad resource name, or a gate that cannot be read.
    """
    _check_resources(resources)
    changes = []
    for resource in resources:
        for opened in gates:
            mark = _read_mark(opened, resource)
            if mark is not None and mark.grantor is not None and mark.grantor != grantor:
                changes.append(MarkChange(resource, opened, mark, f"held by grantor {mark.grantor}, not {grantor}"))
    return changes


def plan_repair(
    source: TokenSource, gates: list[OpenedGate], resources: list[str], *, timeout: float | None = None
) -> list[MarkChange]:
    """The marks above a token freshly minted for their resource, one change each (the fresh token included).

    Marks of another grantor are left to ``rebase`` and not changed here.

    :raises FencingConfigurationError: a bad resource name, or a gate that cannot be read.
    :raises TokenUnavailableError: the source could not mint.
    """
    _check_resources(resources)
    changes = []
    for resource in resources:
        marks = [(opened, _read_mark(opened, resource)) for opened in gates]
        # Minted after the marks were read: above every token the grantor issued before.
        fresh = source.mint(resource, timeout=timeout)
        for opened, mark in marks:
            if mark is None or (mark.grantor is not None and mark.grantor != fresh.grantor):
                continue
            if mark.value > fresh.value:
                reason = f"above the grantor's fresh token {fresh.value}: no honest token can be there"
                changes.append(MarkChange(resource, opened, mark, reason, after=fresh))
    return changes


def apply_changes(
    changes: list[MarkChange], source: TokenSource, *, command: str, timeout: float | None = None
) -> None:
    """Mint a fresh token per resource (unless the plan has one) and set each planned mark to it.

    Each change's ``outcome`` becomes ``done`` or ``skipped: <why>``; each is
    logged on the audit logger.
    """
    fresh: dict[str, FencingToken] = {}
    for change in changes:
        token = change.after or fresh.get(change.resource)
        if token is None:
            token = fresh[change.resource] = source.mint(change.resource, timeout=timeout)
        change.after = token
        try:
            change.gate.gate.reset_mark(token, expected=change.before)  # type: ignore[attr-defined]
        except FencingError as exc:
            change.outcome = f"skipped: {exc}"
            audit.warning("%s: NOT changed %s (%s)", command, change.describe(), exc)
            continue
        change.outcome = "done"
        audit.warning("%s: changed %s", command, change.describe())
