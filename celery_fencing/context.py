"""The token of the execution in progress, carried in a context variable.

The Celery layer sets it when a fenced task starts, so gates called without an
explicit token pick it up anywhere in the task's call stack, and in threads
started through ``contextvars.copy_context()``.
"""

from __future__ import annotations

import itertools
import os
import secrets
import threading
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from types import TracebackType

from .exceptions import InvalidTokenError, LeaseLostError, ResourceMismatchError
from .protocols import TokenSource, TokenVerifier
from .token import FencingToken, validate_resource

__all__ = [
    "DEFAULT_ONCE_RETENTION",
    "AppliedRecord",
    "CurrentExecution",
    "Execution",
    "applied_record",
    "current_execution",
    "current_token",
    "floor_source",
    "fence_state_ttl_ms",
    "new_execution_id",
    "resolve_token",
    "token_context",
]

#: How long a gate keeps "task id T applied on resource R" when the execution
#: says nothing else: one day, Celery's default ``result_expires``.
DEFAULT_ONCE_RETENTION = 86400.0


@dataclass(frozen=True)
class AppliedRecord:
    """What a gate records with an effect, in the same atomic operation: "task *task_id* applied by *execution_id*".

    A later execution of the same task id (a re-delivered copy, a retry) that
    reaches the same gate and resource finds the record and does not apply
    again (:class:`~celery_fencing.AlreadyAppliedError`). The record expires
    after *retention* seconds of the store's own clock.
    """

    task_id: str
    execution_id: str
    retention: float

    @property
    def retention_ms(self) -> int:
        """The retention in whole milliseconds (at least 1), as Redis' ``PX`` takes it."""
        return _milliseconds(self.retention)


# Execution ids: a random prefix per process (drawn again in a forked child) and a
# counter, 32 hex digits as a uuid4's were, at a fraction of uuid4's cost per task.
_id_prefix = secrets.token_hex(8)
_id_counter = itertools.count()


def _new_process_ids() -> None:
    global _id_prefix, _id_counter
    _id_prefix, _id_counter = secrets.token_hex(8), itertools.count()


os.register_at_fork(after_in_child=_new_process_ids)


def new_execution_id() -> str:
    """An id no other execution, in any process, shares: 64 random bits of this process, then a counter."""
    return f"{_id_prefix}{next(_id_counter):016x}"


@dataclass
class Execution:
    """One fenced execution in progress: its token, and whether its grantor session was lost.

    ``session_lost`` is set (from the token source's connection listener) when
    the ZooKeeper session behind the token was suspended or lost. With
    ``abort_on_session_loss``, the execution's next gate call raises
    :class:`~celery_fencing.LeaseLostError` instead of writing. Safety never
    depends on this flag: gates refuse stale tokens regardless.
    """

    token: FencingToken
    task_id: str | None = None
    abort_on_session_loss: bool = False
    session_lost: threading.Event = field(default_factory=threading.Event)
    #: Exactly once: gates record this execution's task id with every effect of its token.
    once: bool = False
    #: Seconds the gates keep the record (with ``once``).
    once_retention: float = DEFAULT_ONCE_RETENTION
    #: Names this execution in applied records: two executions of one task id never share it.
    execution_id: str = field(default_factory=new_execution_id)
    #: Seconds the gates keep their fence state (mark, grantor, key owners) of the
    #: execution's resource, or ``None`` for good. Set for a task-id resource, which
    #: is never fenced again once its task is done.
    transient_retention: float | None = None
    #: The execution's body returned and its result write is to seal the task (no
    #: callbacks to send first, so the seal rides on that write: one round trip less).
    seals_with_result: bool = False
    #: Where a gate that finds its store unarmed (new, or it lost its marks) takes
    #: the floor from: the worker's token source. ``None`` outside a fenced task.
    floor_source: TokenSource | None = None
    #: Whether the execution claimed its token on its gates before its body: the first delivery
    #: of a task fenced on its own id does not (see :func:`celery_fencing.celery.claims.first_delivery`).
    claimed: bool = True
    #: Whether it claimed its token on the task's result: no first delivery does.
    result_claimed: bool = True
    #: The token of the seal and the result write when not :attr:`token`: minted fresh after
    #: the result store refused :attr:`token` below its floor (see
    #: :func:`celery_fencing.celery.claims.remint_unclaimed`). The body's writes keep :attr:`token`.
    fresh_result_token: FencingToken | None = None
    #: Gated writes the execution began (each asks :meth:`applied_record` before its I/O).
    write_attempts: int = 0
    # applied_record(), made once: every gated write of the execution asks for it.
    _record: AppliedRecord | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def result_token(self) -> FencingToken:
        """The token the execution seals and writes its result with."""
        return self.fresh_result_token or self.token

    def applied_record(self) -> AppliedRecord | None:
        """The record a gate writes with this execution's effects, or ``None`` without exactly-once."""
        if not self.once or not self.task_id:
            return None
        self.write_attempts += 1
        record = self._record
        if record is None or record.task_id != self.task_id:
            record = self._record = AppliedRecord(self.task_id, self.execution_id, self.once_retention)
        return record


_current: ContextVar[Execution | None] = ContextVar("celery_fencing_current_execution", default=None)


def current_execution() -> Execution | None:
    """Return the fenced execution in progress in this context, or ``None``."""
    return _current.get()


def applied_record(token: FencingToken) -> AppliedRecord | None:
    """The applied record a gate must write with an effect of *token*, or ``None``.

    Only the current execution's own token carries its task id: a token passed
    explicitly for something else (another resource, an operator's repair)
    records nothing.
    """
    execution = _current.get()
    # Identity first: the gates pass the execution's own token object, and == compares every field.
    if execution is None or not execution.once or (execution.token is not token and execution.token != token):
        return None
    return execution.applied_record()


def fence_state_ttl_ms(token: FencingToken) -> int:
    """Milliseconds a gate keeps its fence state of *token*'s resource: 0 for good.

    Non-zero only for the current execution's own token, on a transient
    resource (a task id).
    """
    execution = _current.get()
    if execution is None or execution.transient_retention is None:
        return 0
    if execution.token is not token and execution.token != token:
        return 0
    return _milliseconds(execution.transient_retention)


def _milliseconds(seconds: float) -> int:
    """Whole milliseconds, at least 1: what Redis' ``PX`` takes (0 would mean no expiry to us)."""
    return max(1, round(seconds * 1000))


def floor_source() -> TokenSource | None:
    """The token source of the fenced execution in progress, from which a gate may arm its store; or ``None``."""
    execution = _current.get()
    return None if execution is None else execution.floor_source


def current_token() -> FencingToken | None:
    """Return the token of the fenced execution in progress, or ``None``."""
    execution = _current.get()
    return None if execution is None else execution.token


def token_context(token: FencingToken | Execution | None) -> CurrentExecution:
    """Make *token* (or a whole :class:`Execution`) current inside the ``with`` block."""
    if token is None or isinstance(token, Execution):
        return CurrentExecution(token)
    if isinstance(token, FencingToken):
        return CurrentExecution(Execution(token))
    raise InvalidTokenError(f"expected a FencingToken, not {type(token).__name__}")


class CurrentExecution:
    """The context manager :func:`token_context` returns: *execution* is current inside its block.

    A class rather than a ``@contextmanager`` generator: a fenced task enters
    one a few times per execution, and a generator costs several times more.
    """

    __slots__ = ("_execution", "_reset")

    def __init__(self, execution: Execution | None) -> None:
        self._execution = execution
        self._reset: Token[Execution | None] | None = None

    def __enter__(self) -> Execution | None:
        self._reset = _current.set(self._execution)
        return self._execution

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._reset is not None:
            _current.reset(self._reset)
            self._reset = None


def resolve_token(
    token: object = None, *, resource: str | None = None, verifier: TokenVerifier | None = None
) -> FencingToken:
    """Return the token a gate operation must use, validated (and verified, given a *verifier*).

    *token* is the caller's explicit token; ``None`` means the current one.
    When *resource* is given, the token must have been minted for it. A gate
    built with ``verifier=`` passes it here, so its origin check runs on every
    token too.

    Gates call this before any I/O, so bad input changes nothing.

    :raises InvalidTokenError: no token at all, or not a :class:`FencingToken`,
        or (``ForgedTokenError``, ``GrantorMismatchError``) one the verifier refuses.
    :raises ResourceMismatchError: the token belongs to another resource.
    """
    execution = _current.get()
    if token is None:
        if execution is None:
            raise InvalidTokenError("no fencing token given, and no fenced task is running in this context")
        token = execution.token
    lost = execution is not None and execution.abort_on_session_loss and execution.session_lost.is_set()
    if lost and execution is not None and token == execution.token:
        raise LeaseLostError(
            f"the grantor session behind token {execution.token.value} of {execution.token.resource!r} "
            "was lost; this execution stops at its next gate call (fencing_abort_on_session_loss)",
            resource=execution.token.resource,
        )
    if not isinstance(token, FencingToken):
        raise InvalidTokenError(
            f"expected a FencingToken, not {type(token).__name__}: {token!r:.60}; "
            "a bare number carries no resource and cannot be checked"
        )
    if execution is not None and token is execution.token:
        checked = token  # the execution's own token, validated when it was minted: every gate call passes it
    else:
        # Re-validate: a frozen dataclass can still be mutated with object.__setattr__.
        checked = FencingToken(token.resource, token.value, token.grantor, token.signature)
    if resource is not None and validate_resource(resource) != checked.resource:
        raise ResourceMismatchError(
            f"token for resource {checked.resource!r} presented for resource {resource!r}",
            token_resource=checked.resource,
            expected_resource=resource,
        )
    if verifier is not None:
        verifier.verify(checked)
    return checked
