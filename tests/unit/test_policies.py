"""On-stale policies: pure decisions, composition, backoff, and parsing from settings."""

from __future__ import annotations

import pytest

# The policies as users import them (the package's public names); the two functions from their module.
from celery_fencing import (
    Decision,
    DeferPolicy,
    ExponentialBackoff,
    FencingConfigurationError,
    IgnorePolicy,
    RaisePolicy,
    RejectPolicy,
    RetryPolicy,
    StaleState,
    StaleTokenError,
)
from celery_fencing.policies import decide, policy_from_setting

ERROR = StaleTokenError(resource="r", token=1, high_water=2)


def state(retries: int = 0, jitter: float = 0.0) -> StaleState:
    return StaleState(error=ERROR, retries=retries, resource="r", jitter=jitter)


def test_retry_backs_off_exponentially_up_to_the_cap() -> None:
    """Delays grow by the factor from the initial delay and stop at the maximum."""
    policy = RetryPolicy(max_retries=20, backoff=ExponentialBackoff(initial=1, factor=2, maximum=10, jitter=0))
    delays = [policy(state(n)).countdown for n in range(6)]  # type: ignore[union-attr]
    assert delays == [1, 2, 4, 8, 10, 10]


def test_jitter_spreads_delays_downwards() -> None:
    """jitter=0.5 and a sample of 1 halves the delay; a sample of 0 keeps it."""
    backoff = ExponentialBackoff(initial=4, factor=1, maximum=4, jitter=0.5)
    assert backoff(0, 0.0) == 4
    assert backoff(0, 0.999999) == pytest.approx(2, rel=1e-3)


def test_huge_attempt_counts_do_not_overflow() -> None:
    """Attempt 10,000 yields the cap instead of an OverflowError."""
    assert ExponentialBackoff(initial=1, factor=10, maximum=30, jitter=0)(10_000, 0) == 30


def test_retry_passes_once_retries_are_spent() -> None:
    """After max_retries the retry policy returns None, and decide() fails the task."""
    policy = RetryPolicy(max_retries=2)
    assert policy(state(1)) is not None
    assert policy(state(2)) is None
    assert decide(policy, state(2)) == Decision("raise")


def test_composition_falls_through_in_order() -> None:
    """`retry | reject` retries while it may, then rejects."""
    policy = RetryPolicy(max_retries=1) | RejectPolicy()
    assert policy(state(0)).action == "retry"  # type: ignore[union-attr]
    assert policy(state(1)) == Decision("reject")
    assert (IgnorePolicy() | RaisePolicy())(state()) == Decision("ignore")


@pytest.mark.parametrize("name", ["retry", "defer", "ignore", "reject", "raise", " Retry "])
def test_policy_names_parse(name: str) -> None:
    """Every documented policy name maps to a policy that decides that action."""
    decision = decide(policy_from_setting(name), state())
    assert decision.action == name.strip().lower()


def test_defer_waits_its_countdown_then_ignores_once_retries_are_spent() -> None:
    """'defer' retries later without failing: after max_retries deferrals it drops the copy, never raises."""
    policy = policy_from_setting(
        "defer", defer_factory=lambda: DeferPolicy(countdown=30, max_retries=2) | IgnorePolicy()
    )
    assert policy(state(0)) == Decision("defer", countdown=30)
    assert policy(state(1)) == Decision("defer", countdown=30)
    assert decide(policy, state(2)) == Decision("ignore")
    assert DeferPolicy(max_retries=0)(state(0)) is None
    assert decide(policy_from_setting("defer"), state()) == Decision("defer", countdown=0)


@pytest.mark.parametrize("kwargs", [{"countdown": -1}, {"countdown": float("nan")}, {"max_retries": -1}], ids=repr)
def test_bad_defer_policy_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(FencingConfigurationError):
        DeferPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["retries", "", 3, None, ["retry"]], ids=repr)
def test_bad_policy_settings_name_the_setting(bad: object) -> None:
    """An unknown policy is a configuration error that names the setting and the choices."""
    with pytest.raises(FencingConfigurationError, match="fencing_on_stale"):
        policy_from_setting(bad)


@pytest.mark.parametrize(
    "kwargs",
    [{"initial": -1}, {"factor": 0.5}, {"maximum": float("inf")}, {"jitter": 2}, {"initial": True}],
    ids=repr,
)
def test_bad_backoff_is_refused(kwargs: dict[str, object]) -> None:
    """Backoff parameters are validated when the policy is built."""
    with pytest.raises(FencingConfigurationError):
        ExponentialBackoff(**kwargs)  # type: ignore[arg-type]


def test_bad_max_retries_is_refused() -> None:
    with pytest.raises(FencingConfigurationError):
        RetryPolicy(max_retries=-1)
