"""FencedTask in eager mode with in-memory source and gate: option checks and the token's path.

These pin the task's logic quickly; the real-worker tests in tests/celery prove it in processes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_fencing import FencingConfigurationError, MemoryGate, MemoryTokenSource, StaleTokenError, current_token
from celery_fencing.celery import FencedTask, fenced_task, signals
from celery_fencing.celery.seals import applied_result
from celery_fencing.policies import Decision, StaleState
from tests.eager_app import eager_app


@pytest.fixture
def app() -> Iterator[Celery]:
    with eager_app("unit", task_eager_propagates=True, fencing_retry_countdown=0) as app:
        yield app


def test_unknown_fencing_option_is_refused(app: Celery) -> None:
    """A misspelt task option fails when the task is defined, naming it."""
    with pytest.raises(FencingConfigurationError, match="fencing_resorce"):

        @app.task(base=FencedTask, fencing_resorce="x", shared=False)
        def task() -> None: ...

        task.run  # noqa: B018 - Celery creates the class lazily


def test_resource_template_uses_bound_arguments(app: Celery) -> None:
    """`account:{account_id}` is filled from positional, keyword and default arguments."""

    @app.task(bind=True, base=FencedTask, fencing_resource="account:{account_id}:{currency}", shared=False)
    def deposit(self: Any, account_id: int, amount: int, currency: str = "EUR") -> str:
        return str(self.request.fencing_token.resource)

    assert deposit.delay(42, 10).get() == "account:42:EUR"
    assert deposit.delay(amount=1, account_id=7, currency="USD").get() == "account:7:USD"


def test_bad_template_names_the_task(app: Celery) -> None:
    """A template naming a missing argument is a configuration error naming the template."""

    @app.task(base=FencedTask, fencing_resource="account:{acount_id}", shared=False)
    def deposit(account_id: int) -> None: ...

    with pytest.raises(FencingConfigurationError, match="acount_id"):
        deposit.delay(1).get()


def test_token_is_current_inside_the_body(app: Celery) -> None:
    """current_token() inside the body is the execution's token; outside it is None."""

    @fenced_task(app, bind=True, shared=False)
    def job(self: Any) -> tuple[int, int]:
        token = current_token()
        assert token is not None
        return token.value, self.request.fencing_token.value

    inside, on_request = job.delay().get()
    assert inside == on_request
    assert current_token() is None


def test_stale_body_is_retried_with_a_new_token(app: Celery) -> None:
    """A StaleTokenError in the body retries the task; the new attempt carries a larger token."""
    gate = MemoryGate()
    tokens: list[int] = []

    @app.task(bind=True, base=FencedTask, fencing_resource="acct", fencing_gates=[gate], shared=False)
    def job(self: Any) -> int:
        tokens.append(self.request.fencing_token.value)
        if len(tokens) == 1:
            gate.claim(app.conf.fencing_source.mint("acct"))  # a newer execution claims
        gate.set(None, "balance", len(tokens))
        return len(tokens)

    # Eager mode runs a retry inline only when errors do not propagate (throw=False).
    assert job.apply(throw=False).get() == 2
    assert len(tokens) == 2 and tokens[1] > tokens[0]
    assert gate.get("balance") == 2 and gate.high_water("acct") == tokens[1]
    assert "override_max_retries" not in job.__dict__, "the fencing retry limit must not leak into autoretry_for"


def test_raise_policy_fails_the_task(app: Celery) -> None:
    """With fencing_on_stale='raise', the StaleTokenError propagates."""
    gate = MemoryGate()

    @app.task(base=FencedTask, fencing_resource="acct", fencing_on_stale="raise", shared=False)
    def job() -> None:
        token = current_token()
        assert token is not None
        gate.claim(app.conf.fencing_source.mint("acct"))
        gate.set(token, "k", 1)

    with pytest.raises(StaleTokenError):
        job.delay().get()


def test_callable_options_are_not_bound_as_methods(app: Celery) -> None:
    """Plain functions given as fencing_resource, fencing_gates and fencing_on_stale are called as they are."""
    gate = MemoryGate()
    decisions: list[str] = []

    def resource(account_id: int) -> str:
        return f"acct-{account_id}"

    def gates() -> list[MemoryGate]:
        return [gate]

    def on_stale(state: StaleState) -> Decision:
        decisions.append(str(state.resource))
        return Decision("raise")

    @app.task(
        bind=True,
        base=FencedTask,
        fencing_resource=resource,
        fencing_gates=gates,
        fencing_on_stale=on_stale,
        shared=False,
    )
    def job(self: Any, account_id: int) -> str:
        gate.claim(app.conf.fencing_source.mint(self.request.fencing_resource))
        gate.set(None, "k", 1)
        return "unreachable"

    with pytest.raises(StaleTokenError):
        job.delay(5).get()
    assert decisions == ["acct-5"]
    assert gate.high_water("acct-5") is not None


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("sku:{skuu}", "names {skuu}, which the task does not take (it takes: qty, sku); did you mean {sku}?"),
        ("sku:{0}", "has a positional field {0}"),
        ("sku:{}", "has a positional field {}"),
        ("sku:{sku", "is malformed"),
    ],
    ids=["unknown-argument", "positional", "empty", "malformed"],
)
def test_bad_resource_template_is_refused_when_the_task_is_defined(template: str, message: str) -> None:
    """A template that cannot be formatted from the task's arguments fails at definition, not at every message."""
    app = Celery("templates", set_as_current=False)
    app.finalize()
    with pytest.raises(FencingConfigurationError, match=re.escape(message)):

        @app.task(base=FencedTask, fencing_resource=template, shared=False)
        def reserve(sku: str, qty: int) -> None: ...

        assert reserve.name


def test_templates_may_reach_into_arguments_and_bound_tasks_skip_self() -> None:
    """Attribute and index access in a field, bind=True and **kwargs are all accepted at definition."""
    app = Celery("templates", set_as_current=False)
    app.finalize()

    @app.task(base=FencedTask, fencing_resource="order:{order.id}:{items[0]}", shared=False)
    def ship(order: object, items: list[str]) -> None: ...

    @app.task(bind=True, base=FencedTask, fencing_resource="sku:{sku}", shared=False)
    def bound(self: object, sku: str) -> None: ...

    @app.task(base=FencedTask, fencing_resource="any:{whatever}", shared=False)
    def flexible(**kwargs: object) -> None: ...

    assert {ship.name, bound.name, flexible.name}


def test_resource_error_names_no_argument_value() -> None:
    """A resource that cannot be built at run time says why without putting the arguments' values in the log."""
    app = Celery("templates", set_as_current=False)
    app.finalize()

    @app.task(base=FencedTask, fencing_resource=lambda card: f"card:{card['number']}", shared=False)
    def charge(card: dict[str, str]) -> None: ...

    with pytest.raises(FencingConfigurationError) as refused:
        charge.fencing_resource_for((), {"card": {"holder": "4111 1111 1111 1111"}})
    assert "4111" not in str(refused.value) and "card" in str(refused.value)


def test_a_direct_call_of_a_task_id_task_is_a_plain_call(app: Celery) -> None:
    """add(1, 1) is no execution of a task: it returns the function's value, with no token and nothing claimed."""

    @app.task(base=FencedTask, shared=False)
    def add(x: int, y: int) -> tuple[int, object]:
        return x + y, current_token()

    assert add(1, 1) == (2, None)


def test_a_direct_call_of_a_domain_task_is_still_fenced(app: Celery) -> None:
    """A direct call on a domain resource mints and claims like an execution, so its gate writes carry a token."""
    gate = MemoryGate()

    @app.task(base=FencedTask, fencing_resource="acct:{n}", fencing_gates=[gate], shared=False)
    def credit(n: int) -> int:
        gate.set(None, f"acct:{n}", 1)
        token = current_token()
        assert token is not None
        return token.value

    assert credit(3) == gate.high_water("acct:3")


def test_wrong_arguments_fail_with_celerys_type_error(app: Celery) -> None:
    """Arguments that do not fit the task fail with the TypeError Celery gives, not a fencing error."""

    @app.task(base=FencedTask, fencing_resource="acct:{n}", shared=False, typing=False)
    def credit(n: int) -> int:
        return n

    with pytest.raises(TypeError, match="missing a required argument: 'n'"):
        credit.apply(()).get()


def _refused_by_a_newer_copy(app: Celery, on_stale: str | None) -> tuple[Any, MemoryGate, list[tuple[int, int]]]:
    """A task fenced on its id whose first attempt meets a newer copy of itself: one that claims and then dies."""
    gate = MemoryGate()
    attempts: list[tuple[int, int]] = []
    options = {} if on_stale is None else {"fencing_on_stale": on_stale}

    @app.task(bind=True, base=FencedTask, fencing_gates=[gate], shared=False, **options)
    def job(self: Any) -> int:
        attempts.append((int(self.request.retries or 0), self.request.fencing_token.value))
        if len(attempts) == 1:
            gate.claim(app.conf.fencing_source.mint(self.request.id))  # the newer copy claims, then dies
        gate.set(None, "effect", len(attempts))
        return len(attempts)

    return job, gate, attempts


def test_refused_copy_of_a_task_fenced_on_its_id_defers_and_its_retry_applies(app: Celery) -> None:
    """The default for a task-id resource: defer; the retry mints a fresh token and applies the task the dead copy left.

    Eager mode runs the retry inline; the worker publishes it with the
    ``fencing_defer_countdown`` (tests/celery/test_dropped_copies.py).
    """
    job, gate, attempts = _refused_by_a_newer_copy(app, None)
    rejected: list[dict[str, Any]] = []

    def on_rejected(**fields: Any) -> None:
        rejected.append(fields)

    signals.fencing_rejected.connect(on_rejected, weak=False)
    try:
        assert job.apply(throw=False).get() == 2
    finally:
        signals.fencing_rejected.disconnect(on_rejected)
    assert [retries for retries, _ in attempts] == [0, 1]
    assert attempts[1][1] > attempts[0][1]
    assert gate.get("effect") == 2
    assert [(r["phase"], r["action"]) for r in rejected] == [("body", "defer")]


def test_explicit_ignore_still_drops_the_refused_copy(app: Celery) -> None:
    """Negative control: an explicit fencing_on_stale='ignore' stays as chosen; the refused copy is dropped and,
    the newer copy being dead, nothing applies the task."""
    job, gate, attempts = _refused_by_a_newer_copy(app, "ignore")
    result = job.apply(throw=False)
    assert result.state == "IGNORED"
    assert len(attempts) == 1 and gate.get("effect") is None


def test_copy_refused_at_its_claim_defers_too(app: Celery) -> None:
    """A newer copy that claims between this copy's mint and its claim: the refused claim defers, the retry applies."""
    gate = MemoryGate()
    ran: list[int] = []

    class NewerCopyClaimsFirst(MemoryTokenSource):
        def mint(self, resource: str, *, timeout: float | None = None) -> Any:
            token = super().mint(resource, timeout=timeout)
            if not ran and gate.high_water(resource) is None:
                gate.claim(super().mint(resource))  # the newer copy mints and claims, then dies
            return token

    app.conf.fencing_source = NewerCopyClaimsFirst()

    @app.task(bind=True, base=FencedTask, fencing_gates=[gate], shared=False)
    def job(self: Any) -> int:
        ran.append(self.request.retries or 0)
        gate.set(None, "effect", 1)
        return 1

    assert job.apply(throw=False).get() == 1
    assert ran == [1], "the body ran once, in the retry, not in the refused attempt"
    assert gate.get("effect") == 1


def test_an_eager_duplicate_takes_a_result_only_from_a_fenced_result_store(app: Celery) -> None:
    """Without a fenced result backend nothing seals, so no stored result is handed to an eager duplicate."""
    assert applied_result(app.backend, "any-task-id") is None  # DisabledBackend: get_task_meta would raise
