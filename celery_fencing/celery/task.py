"""``FencedTask``: a Celery task base class that runs every execution under a fencing token.

Lifecycle of one execution (all inside Celery's tracer, so ``Retry``,
``Ignore`` and ``Reject`` raised here behave as if raised by the task body):

1. ``before_start``: compute the resource from the task's arguments, mint a
   token (or take an exclusive lease and its token), put it on
   ``self.request.fencing_token``, then **claim** it on every gate in
   ``fencing_gates`` and on a fenced result backend, before the body reads
   anything (the first delivery of a task fenced on its own id need not:
   :func:`.claims.first_delivery`). A refused claim means a newer execution started.
2. ``__call__``: run the body with the token as the current token
   (:func:`celery_fencing.current_token`), so gates called without a token use it.
3. A :class:`~celery_fencing.StaleTokenError` (or a lost lease) anywhere in 1-2
   goes to the task's on-stale policy: retry (new attempt, new token, re-read,
   redo), defer (a task fenced on its id: retry later, once the newer copy
   that fenced it out applied the task or died), ignore, reject or raise. A
   source that cannot mint, or a store that is down at the claim, is retried
   with the same backoff: the body never runs unfenced. So is an
   :class:`~celery_fencing.EffectPendingError` from the body (an idempotency
   key claimed by another execution that has recorded no outcome yet).
4. Exactly once (``fencing_once``, on by default): every gated write of the
   execution records its task id in the same atomic operation. A later
   execution of the same task id that meets the record gets
   :class:`~celery_fencing.AlreadyAppliedError` and ends as done: it applies
   nothing again. When the body returns, the execution **seals** the task on
   a fenced result backend, before Celery sends the callbacks: the first
   execution to seal is the one whose result stands and whose chain goes on.

Task options (class attributes, or keyword arguments of ``@app.task``): see
:mod:`celery_fencing.celery.options`, which checks them when a task is defined.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Ignore

from ..context import Execution, token_context
from ..exceptions import (
    AlreadyAppliedError,
    BelowFloorError,
    EffectPendingError,
    FencingConfigurationError,
    FencingError,
    GateUnavailableError,
    LeaseLostError,
    StaleTokenError,
    TokenUnavailableError,
)
from ..policies import (
    DeferPolicy,
    ExponentialBackoff,
    IgnorePolicy,
    Policy,
    RetryPolicy,
    StaleState,
    decide,
    policy_from_setting,
)
from ..protocols import Gate, LeasingSource, LockDelaySource, TransientSource, conforms, declares
from . import signals
from .claims import (
    arm_stores,
    claim_stores,
    first_delivery,
    skip_block_below_floor,
)
from .decisions import enact
from .options import check_task_options, resource_for
from .reports import report_duplicate, report_fenced_out
from .runtime import FencingRuntime, HeldLease, runtime_for, task_option
from .seals import AppliedResult, applied_result, seal, seal_awaited
from .settings import FencingSettings, setting

__all__ = ["FencedTask"]

logger = logging.getLogger("celery_fencing")

#: What FencedTask keeps on ``self.request``; reset at the start of every execution.
REQUEST_ATTRIBUTES = (
    "fencing_token",
    "fencing_execution",
    "fencing_lease",
    "fencing_resource",
    "fencing_resource_is_task_id",
    "fencing_applied_result",
)

# Errors that mean "this execution must not go on"; the policy decides what follows.
_FENCED_OUT = (StaleTokenError, LeaseLostError)


class FencedTask(Task):  # type: ignore[misc]
    """Base class of fenced tasks: ``@app.task(base=FencedTask, fencing_resource="account:{account_id}")``.

    ``self.request.fencing_token`` holds the execution's :class:`FencingToken`
    and ``self.request.fencing_resource`` its resource. Thread safety: one task
    instance serves every execution in a process; all per-execution state lives
    on ``self.request`` (a thread-local stack), never on ``self``.
    """

    fencing_resource: ClassVar[str | Callable[..., str] | None] = None
    fencing_on_stale: ClassVar[str | Policy | None] = None
    fencing_gates: ClassVar[Sequence[Gate] | Callable[[], Sequence[Gate]]] = ()
    fencing_mode: ClassVar[str | None] = None
    fencing_lock_delay: ClassVar[float | None] = None
    fencing_once: ClassVar[bool | None] = None
    fencing_max_retries: ClassVar[int | None] = None
    fencing_retry_countdown: ClassVar[float | None] = None
    fencing_retry_backoff_factor: ClassVar[float | None] = None
    fencing_retry_max_delay: ClassVar[float | None] = None
    fencing_retry_jitter: ClassVar[float | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_task_options(cls)

    # Configuration -------------------------------------------------------------------

    def _settings(self) -> FencingSettings:
        return runtime_for(self.app).settings()

    def _option(self, name: str, settings: FencingSettings) -> Any:
        value = getattr(self, f"fencing_{name}", None)
        if value is None:
            return getattr(settings, name)
        return setting(f"fencing_{name}").parse(f"{type(self).__name__}.fencing_{name}", value)

    def _retry_policy(self, settings: FencingSettings) -> RetryPolicy:
        backoff = ExponentialBackoff(
            initial=self._option("retry_countdown", settings),
            factor=self._option("retry_backoff_factor", settings),
            maximum=self._option("retry_max_delay", settings),
            jitter=self._option("retry_jitter", settings),
        )
        return RetryPolicy(max_retries=self._option("max_retries", settings), backoff=backoff)

    def _stale_policy(self, settings: FencingSettings, resource_is_task_id: bool) -> Policy:
        own = task_option(self, "fencing_on_stale")
        configured = own if own is not None else settings.on_stale
        if configured is None:
            # A task-id refusal means a newer copy of the task holds it, which may still die: defer to it.
            configured = "defer" if resource_is_task_id else "retry"
        return policy_from_setting(
            configured,
            retry_factory=lambda: self._retry_policy(settings),
            # Deferrals count as retries; past the limit the copy is dropped, never failed.
            defer_factory=lambda: (
                DeferPolicy(settings.defer_countdown, self._option("max_retries", settings)) | IgnorePolicy()
            ),
        )

    def fencing_resource_for(self, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
        """Return the resource this execution is fenced on (see :func:`.options.resource_for`).

        :raises FencingConfigurationError: the template names an argument the
            task does not take, or yields an invalid resource.
        """
        return resource_for(self, task_option(self, "fencing_resource"), args, kwargs)

    # Lifecycle ----------------------------------------------------------------------

    def before_start(self, task_id: str, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """Mint (or lease) the execution's token and claim it before the body runs."""
        try:
            self._start_fencing(args, kwargs)
        except AppliedResult as applied:  # eager, and sealed by another: __call__ returns its result
            self.request.fencing_applied_result = applied

    def _start_fencing(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Execution:
        request = self.request
        # Celery copies a message's custom headers onto the request: a producer
        # could send fencing_token or fencing_lease headers. Nothing the message
        # carries is trusted; the worker sets every fencing attribute itself.
        for name in REQUEST_ATTRIBUTES:
            setattr(request, name, None)
        settings = self._settings()
        resource = self.fencing_resource_for(args, kwargs)
        resource_is_task_id = self.fencing_resource is None
        request.fencing_resource = resource
        request.fencing_resource_is_task_id = resource_is_task_id
        runtime = runtime_for(self.app)
        source = runtime.source()
        gates = runtime.gates(self)
        mode = self.fencing_mode or settings.mode
        started = time.monotonic()
        self._arm_stores(gates, source, resource, resource_is_task_id, settings)
        remint = mode != "exclusive"  # once: a token below a store's floor (the store was just armed)
        # A token of a block may be below one another process handed out earlier: a refusal
        # of it says only that the block is old. Draw from the block first; mint fresh (a
        # coordinator write, above every token handed out before) before concluding anything.
        # A retry follows a refusal (or an outage) more often than not: it mints fresh at once.
        in_block = remint and not request.retries and runtime.draws_from_blocks(source)
        while True:
            execution = self._mint_execution(
                runtime, source, resource, resource_is_task_id, settings, mode, started, in_block=in_block
            )
            # No older execution of this task id can exist (see first_delivery): on its own id the
            # task claims nothing, on a domain resource only its gates (other tasks contend there).
            first = not settings.claim_first_delivery and first_delivery(request, execution)
            if first and resource_is_task_id and mode != "exclusive":
                execution.claimed = execution.result_claimed = False
                return execution
            execution.result_claimed = not first and not request.ignore_result
            held = request.fencing_lease
            try:
                with token_context(execution):  # the gates read the execution's retention from it
                    backend = None if request.ignore_result or first else self.backend
                    unclaimed = gates if held is None else held.unclaimed(gates)
                    claim_stores(unclaimed, backend, execution.token, request.id, batch=resource_is_task_id)
                if held is not None:
                    held.claimed_on(gates)
            except BelowFloorError as exc:
                # The store had lost its marks (or was new) and was armed with a floor minted
                # after this token: not a newer execution. Mint a fresh token (above the floor).
                self._end(execution, keep_lease=False)
                skip_block_below_floor(source, exc)
                if remint:
                    remint = in_block = False
                    logger.info("task %s[%s]: %s; minting a fresh token", self.name, request.id, exc)
                    continue
                self._fenced_out(exc, resource, resource_is_task_id, settings, phase="claim", unavailable=True)
            except AlreadyAppliedError as exc:
                # The task was sealed by another execution: it is done, nothing to run.
                self._end(execution, keep_lease=False)
                self._already_applied(exc, resource, phase="claim", finish=False)
            except _FENCED_OUT as exc:
                self._end(execution, keep_lease=False)
                if in_block and isinstance(exc, StaleTokenError):
                    in_block = False
                    logger.debug(
                        "task %s[%s]: %s, with a token of a block; minting a fresh token", self.name, request.id, exc
                    )
                    continue
                self._fenced_out(exc, resource, resource_is_task_id, settings, phase="claim")
            except GateUnavailableError as exc:
                # A gate's store is down (restarting, unreachable): not a newer execution.
                # Retry with backoff like an unavailable grantor; failing here would be out
                # of reach of autoretry_for, and acks_late would then lose the task.
                self._end(execution, keep_lease=False)
                self._fenced_out(exc, resource, resource_is_task_id, settings, phase="claim", unavailable=True)
            except BaseException:
                self._end(execution, keep_lease=False)
                raise
            return execution

    def _arm_stores(
        self, gates: Sequence[Gate], source: Any, resource: str, resource_is_task_id: bool, settings: FencingSettings
    ) -> None:
        """Give the task's stores a floor, before the token is minted, where they have none (once per process).

        A store without its floor (new, or it lost its data) refuses every token;
        armed now, from the worker's source, the token minted next passes it.
        """
        backend = None if self.request.ignore_result else self.backend
        try:
            arm_stores(gates, backend, resource, source)
        except (GateUnavailableError, TokenUnavailableError) as exc:
            self._fenced_out(exc, resource, resource_is_task_id, settings, phase="claim", unavailable=True)

    def _mint_execution(
        self,
        runtime: FencingRuntime,
        source: Any,
        resource: str,
        resource_is_task_id: bool,
        settings: FencingSettings,
        mode: str,
        started: float,
        *,
        in_block: bool = False,
    ) -> Execution:
        """Mint (or lease) a token for *resource* and make the execution that carries it current on the request.

        *in_block*: take the next token of the process's block (*source* is a :class:`BlockSource`).
        """
        request = self.request
        held: HeldLease | None = None
        try:
            if mode == "exclusive":
                if not conforms(source, LeasingSource):
                    raise FencingConfigurationError(
                        f"task {self.name}: fencing_mode='exclusive' needs a source with leases (ZooKeeper), "
                        f"not {type(source).__name__}"
                    )
                held = runtime.take_lease(resource) if settings.lease_reuse else None
                if held is None:
                    held = self._take_lease(runtime, source, resource, settings)
                request.fencing_lease = held
                token = held.lease.token
            elif in_block:
                token = source.mint_in_block(resource, timeout=settings.timeout)
            else:
                # A task id is never minted for again once its task is done: a source
                # that can mint without keeping per-resource state (ZooKeeper) should. Its
                # own method only: one a wrapper forwards would skip the wrapper's mint.
                transient = resource_is_task_id and declares(source, TransientSource)
                token = (source.mint_transient if transient else source.mint)(resource, timeout=settings.timeout)
        except TokenUnavailableError as exc:
            self._fenced_out(exc, resource, resource_is_task_id, settings, phase="mint", unavailable=True)
        once = self._option("once", settings)
        execution = Execution(
            token,
            task_id=request.id,
            abort_on_session_loss=settings.abort_on_session_loss,
            once=once,
            once_retention=settings.once_retention,
            # A task id is never fenced again once its task is done: its fence state expires with the records.
            transient_retention=settings.once_retention if resource_is_task_id else None,
            floor_source=source,
        )
        request.fencing_token = token
        request.fencing_execution = execution
        runtime.track(execution)
        if held is not None:
            held.execution = execution  # told when the lease is lost (see HeldLease.on_lease_lost)
            if held.lease.lost:
                execution.session_lost.set()
        signals.token_minted.send(
            sender=self, task_id=request.id, token=token, mode=mode, duration=time.monotonic() - started
        )
        logger.debug("task %s[%s] minted %r", self.name, request.id, token)
        return execution

    def _take_lease(
        self, runtime: FencingRuntime, source: LeasingSource, resource: str, settings: FencingSettings
    ) -> HeldLease:
        options: dict[str, Any] = {"timeout": settings.timeout}
        delay = self._option("lock_delay", settings)
        if conforms(source, LockDelaySource):
            # Wait a lock-delay out in place: the lease may take the delay on top of the usual wait.
            options.update(lock_delay=delay, timeout=settings.timeout + delay)
        elif delay:
            raise FencingConfigurationError(
                f"task {self.name}: fencing_lock_delay={delay} needs a source whose leases take a lock-delay "
                f"(ZooKeeperTokenSource), not {type(source).__name__}"
            )
        return runtime.enter_lease(source, resource, settings.lease_reuse, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # An eager execution whose task id another execution sealed returns that one's result
        # (see _already_applied): found before the body (by before_start) or during it.
        applied: AppliedResult | None = self.request.get("fencing_applied_result")
        if applied is not None:
            return applied.result
        try:
            return self._call_fenced(args, kwargs)
        except AppliedResult as found:
            return found.result

    def _call_fenced(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        request = self.request
        execution: Execution | None = request.get("fencing_execution")
        if execution is None:
            # Called directly (task(...)), without the tracer: before_start did not run.
            if self.fencing_resource is None and not request.id:
                # Fenced on its task id, and there is none: a direct call is no execution of a
                # task, just the function. Its gate writes need an explicit token.
                return super().__call__(*args, **kwargs)
            execution = self._start_fencing(args, kwargs)
        # Only an execution that ended without a fencing error may leave its lease (and
        # token) to the next task of its resource: a token a gate refused once would
        # only be refused again, and a lost lease must be taken anew.
        keep_lease = True
        try:
            with token_context(execution):
                result = super().__call__(*args, **kwargs)
            self._seal(execution)
            return result
        except AlreadyAppliedError as exc:
            keep_lease = False
            # Superseded: a newer execution of this task applied, and it finishes the task.
            # Else an older one applied: it finishes the task if it is still running (its
            # seal comes within moments); if it is gone, this execution finishes the task.
            finish = not exc.superseded and not seal_awaited(self, execution, self._settings().timeout)
            self._already_applied(exc, execution.token.resource, phase="body", finish=finish)
            self._seal(execution)
            return None
        except (*_FENCED_OUT, EffectPendingError, GateUnavailableError) as exc:
            keep_lease = False
            if isinstance(exc, GateUnavailableError) and (execution.claimed or execution.write_attempts > 1):
                raise
            # Not a newer execution, so not for the stale policy (retry with backoff, or fail
            # once retries run out): a store that lost its marks while this execution ran (the
            # repeat mints a token above its floor); an idempotency key another execution
            # claimed and has recorded no outcome for yet (the repeat finds the outcome); a
            # store that is down at the first write of an execution without a claim, where the
            # claim would have met it (nothing of it is applied; after a write went through, a
            # retry would find it applied and end the task with the rest undone: the error is
            # then the body's).
            not_newer = isinstance(exc, (BelowFloorError, EffectPendingError, GateUnavailableError))
            if isinstance(exc, BelowFloorError):
                skip_block_below_floor(execution.floor_source, exc)
            self._fenced_out(
                exc,
                execution.token.resource,
                bool(request.get("fencing_resource_is_task_id")),
                self._settings(),
                phase="body",
                unavailable=not_newer,
            )
        except FencingError:
            keep_lease = False
            raise
        finally:
            self._end(execution, keep_lease=keep_lease)

    def push_request(self, *args: Any, **kwargs: Any) -> None:
        """Push a request as Celery does, without turning the fencing attributes into message headers.

        Celery's ``Task.__call__`` pushes a copy of the current request
        (``Context(**request.__dict__)``) for the body, and a new ``Context``
        takes every attribute it does not know as a custom header. The body's
        request would then list ``fencing_token`` and the other attributes
        ``before_start`` set among its headers, and ``self.retry()`` would send
        them with the retry: a FencingToken is no JSON, so the retry fails. The
        body's request keeps the attributes; only its headers lose them.
        """
        super().push_request(*args, **kwargs)
        request = self.request
        headers = request.headers
        if isinstance(headers, dict) and any(name in headers for name in REQUEST_ATTRIBUTES):
            request.headers = {key: value for key, value in headers.items() if key not in REQUEST_ATTRIBUTES} or None

    def _seal(self, execution: Execution) -> None:
        """Seal the task (see :func:`.seals.seal`); ``Ignore`` when another execution sealed it first."""
        try:
            seal(self.backend, self.request, execution, self._settings().timeout)
        except AlreadyAppliedError as exc:
            self._already_applied(exc, execution.token.resource, phase="seal", finish=False)

    def _already_applied(self, exc: AlreadyAppliedError, resource: str, *, phase: str, finish: bool) -> None:
        """Report a duplicate prevented; raise ``Ignore`` unless this execution is to *finish* the task.

        *finish* is for the newest execution: the one that applied is gone
        (failed, retried, died), so this one ends the task as done, with no
        return value, instead of leaving it unfinished. An eager execution
        raises :class:`.seals.AppliedResult` instead of ``Ignore`` when the
        task's stored result is a SUCCESS: its caller gets that result.
        """
        applied = None if finish or not self.request.is_eager else applied_result(self.backend, self.request.id)
        report_duplicate(self, exc, resource, phase, "done" if finish or applied else "ignore")
        if applied is not None:
            raise applied
        if not finish:
            raise Ignore(str(exc))

    def _end(self, execution: Execution, *, keep_lease: bool) -> None:
        """Forget the execution; release its lease, or keep it for the next task (``fencing_lease_reuse``)."""
        runtime = runtime_for(self.app)
        runtime.untrack(execution)
        held = self.request.get("fencing_lease")
        if isinstance(held, HeldLease):
            self.request.fencing_lease = None
            resource = execution.token.resource
            if not (keep_lease and runtime.keep_lease(resource, held)):
                held.release()

    # Rejections -----------------------------------------------------------------------

    def _fenced_out(
        self,
        exc: FencingError,
        resource: str,
        resource_is_task_id: bool,
        settings: FencingSettings,
        *,
        phase: str,
        unavailable: bool = False,
    ) -> Any:
        """Turn a fencing error into the policy's decision. Never returns.

        *phase* says where the error came from: ``mint`` (no token could be had),
        ``claim`` (a newer execution had already started) or ``body`` (a gated
        write, or a gate call after the session was lost).
        """
        request = self.request
        state = StaleState(
            error=exc,
            retries=int(request.retries or 0),
            resource=resource,
            resource_is_task_id=resource_is_task_id,
            jitter=random.random(),
        )
        # A grantor that is down is not a newer execution: retry it with backoff
        # whatever the stale policy says; the body never runs without a token.
        policy: Policy = (
            self._retry_policy(settings) if unavailable else self._stale_policy(settings, resource_is_task_id)
        )
        decision = decide(policy, state)
        report_fenced_out(self, exc, resource, phase, decision)
        raise enact(self, decision, exc)
