"""What a fenced task does when it is fenced out: small, pure, composable policies.

A policy is called with one :class:`StaleState` and returns a :class:`Decision`,
or ``None`` to let the next policy in a chain decide (``a | b``). Policies never
sleep and never touch Celery: the Celery layer turns a decision into
``self.retry(countdown=...)``, ``Ignore()``, ``Reject()`` or a failure.

================  =====================================================
``"retry"``       a new attempt: new token, re-read, redo, with backoff
``"ignore"``      drop the execution: a newer one owns the result
``"reject"``      hand the message to the broker's dead-letter path
``"raise"``       fail the task with the error
================  =====================================================

Example: retry five times with exponential backoff, then dead-letter::

    on_stale = RetryPolicy(max_retries=5, backoff=ExponentialBackoff(1, 2, 30)) | RejectPolicy()
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from .exceptions import FencingConfigurationError, FencingError
from .values import count, number, seconds

__all__ = [
    "POLICY_NAMES",
    "Backoff",
    "Decision",
    "DeferPolicy",
    "ExponentialBackoff",
    "FirstOf",
    "IgnorePolicy",
    "Policy",
    "RaisePolicy",
    "RejectPolicy",
    "RetryPolicy",
    "StaleState",
    "decide",
    "policy_from_setting",
]

Action = Literal["retry", "defer", "ignore", "reject", "raise"]
POLICY_NAMES: tuple[Action, ...] = ("retry", "defer", "ignore", "reject", "raise")


@dataclass(frozen=True)
class StaleState:
    """Everything a policy may look at. The only input of a policy.

    :param error: why the execution was fenced out (stale token, grantor down, lease lost).
    :param retries: how many times this task was already retried (Celery's ``request.retries``).
    :param resource: the resource the token was for.
    :param resource_is_task_id: the resource defaulted to the task id, so a
        newer execution of this very task exists and owns the result.
    :param jitter: a uniform sample in [0, 1) drawn by the caller, so policies stay pure.
    """

    error: FencingError
    retries: int = 0
    resource: str | None = None
    resource_is_task_id: bool = False
    jitter: float = 0.0


@dataclass(frozen=True)
class Decision:
    """What to do: an action and, for ``"retry"`` and ``"defer"``, the delay in seconds before the next attempt."""

    action: Action
    countdown: float | None = None

    def __post_init__(self) -> None:
        if self.action not in POLICY_NAMES:
            raise FencingConfigurationError(f"unknown action {self.action!r}; expected one of {POLICY_NAMES}")


class Policy(Protocol):
    def __call__(self, state: StaleState) -> Decision | None: ...


class _Composable:
    def __or__(self, other: Policy) -> FirstOf:
        return FirstOf(self, other)  # type: ignore[arg-type]


@dataclass(frozen=True)
class FirstOf(_Composable):
    """Ask each policy in turn; the first decision wins."""

    policies: tuple[Policy, ...]

    def __init__(self, *policies: Policy) -> None:
        flat: list[Policy] = []
        for policy in policies:
            flat.extend(policy.policies if isinstance(policy, FirstOf) else (policy,))
        object.__setattr__(self, "policies", tuple(flat))

    def __call__(self, state: StaleState) -> Decision | None:
        for policy in self.policies:
            decision = policy(state)
            if decision is not None:
                return decision
        return None


class Backoff(Protocol):
    def __call__(self, attempt: int, jitter: float) -> float: ...


@dataclass(frozen=True)
class ExponentialBackoff:
    """``initial * factor ** attempt`` seconds, capped at ``maximum``, spread by ``jitter``.

    ``jitter`` is the fraction of the delay that is randomised: with 0.25 the
    delay lies in [0.75 d, d]. Spreading matters here: retries of tasks fenced
    out by one newer execution would otherwise all come back at once.
    """

    initial: float = 1.0
    factor: float = 2.0
    maximum: float = 60.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        for name in ("initial", "maximum"):
            seconds(f"backoff {name}", getattr(self, name), zero=True)
        number("backoff factor", self.factor, minimum=1)
        if not 0 <= self.jitter <= 1:
            raise FencingConfigurationError(f"backoff jitter must be within [0, 1], got {self.jitter!r}")

    def __call__(self, attempt: int, jitter: float) -> float:
        # Cap the exponent before computing it: factor ** attempt overflows for large attempts.
        delay = self.maximum if attempt > 64 else min(self.maximum, self.initial * self.factor**attempt)
        return delay * (1 - self.jitter * jitter)


@dataclass(frozen=True)
class RetryPolicy(_Composable):
    """Retry with backoff while fewer than ``max_retries`` retries happened; then pass.

    Pass means: return ``None``, so ``RetryPolicy() | RejectPolicy()`` rejects
    once the retries are spent, and a lone ``RetryPolicy()`` ends in a failure.
    """

    max_retries: int = 10
    backoff: Backoff = field(default_factory=ExponentialBackoff)

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise FencingConfigurationError(f"max_retries must be an int >= 0, got {self.max_retries!r}")

    def __call__(self, state: StaleState) -> Decision | None:
        if state.retries >= self.max_retries:
            return None
        return Decision("retry", countdown=self.backoff(state.retries, state.jitter))


@dataclass(frozen=True)
class DeferPolicy(_Composable):
    """Defer to a newer execution of the same task: a retry in *countdown* seconds, in a new message.

    For a task fenced on its own id, a refusal means a newer copy of the task
    holds the resource, not that the task is done: that copy may still die
    before it applies. Dropping this copy would then lose the task (on the
    Redis broker its acknowledgement also removes the newer copy's unacked
    entry, which shares the delivery tag: nothing re-delivers it). The retry
    mints a fresh token: it finds the task applied and ends as done, or finds
    the newer copy gone and applies it. Passes (``None``) once ``max_retries``
    retries happened, so ``DeferPolicy() | IgnorePolicy()`` ends a task that
    keeps meeting newer copies the way ``ignore`` does.
    """

    countdown: float = 0.0
    max_retries: int = 10

    def __post_init__(self) -> None:
        seconds("defer countdown", self.countdown, zero=True)
        if not isinstance(self.max_retries, int):
            raise FencingConfigurationError(f"max_retries must be an int >= 0, got {self.max_retries!r}")
        count("max_retries", self.max_retries)

    def __call__(self, state: StaleState) -> Decision | None:
        if state.retries >= self.max_retries:
            return None
        return Decision("defer", countdown=float(self.countdown))


@dataclass(frozen=True)
class IgnorePolicy(_Composable):
    """Drop the execution. Right when a newer execution of the same task owns the result."""

    def __call__(self, state: StaleState) -> Decision | None:
        return Decision("ignore")


@dataclass(frozen=True)
class RejectPolicy(_Composable):
    """Reject the message (no requeue): it goes to the broker's dead-letter path, if any."""

    def __call__(self, state: StaleState) -> Decision | None:
        return Decision("reject")


@dataclass(frozen=True)
class RaisePolicy(_Composable):
    """Fail the task with the fencing error."""

    def __call__(self, state: StaleState) -> Decision | None:
        return Decision("raise")


def decide(policy: Policy, state: StaleState) -> Decision:
    """Run *policy*; when no policy in it decides, the task fails (``"raise"``)."""
    return policy(state) or Decision("raise")


def policy_from_setting(
    value: object,
    *,
    retry_factory: Callable[[], RetryPolicy] = RetryPolicy,
    defer_factory: Callable[[], Policy] = lambda: DeferPolicy() | IgnorePolicy(),
    what: str = "fencing_on_stale",
) -> Policy:
    """Turn a setting (a name from :data:`POLICY_NAMES`, or a policy object) into a policy.

    ``"defer"`` is :class:`DeferPolicy` then :class:`IgnorePolicy`: a deferral
    never fails the task (a failure would be stored over the newer copy's result).

    :raises FencingConfigurationError: naming the setting and the accepted values.
    """
    if isinstance(value, str):
        name = value.strip().lower()
        if name == "retry":
            return retry_factory()
        if name == "defer":
            return defer_factory()
        if name == "ignore":
            return IgnorePolicy()
        if name == "reject":
            return RejectPolicy()
        if name == "raise":
            return RaisePolicy()
        raise FencingConfigurationError(f"{what}={value!r} is not one of {', '.join(POLICY_NAMES)}")
    if callable(value):
        return value  # type: ignore[return-value,unused-ignore]
    raise FencingConfigurationError(
        f"{what} must be one of {', '.join(POLICY_NAMES)} or a policy object, not {type(value).__name__}"
    )
