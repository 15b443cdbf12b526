"""The idempotency-key protocol, key derivation and ``run_once``/``@idempotent`` (no driver imported here).

What "once" means here, precisely
---------------------------------
``run_once(store, key, call)`` claims *key* in the store, makes the call,
then records its outcome under the key. A repeat with the same key (a Celery
retry or a re-delivery of the same task: both keep the task id) returns the
recorded outcome without calling. The claim and the record are two writes
around a call the store cannot see, so there is a gap, and what happens when
the process dies inside it is a choice:

* ``reclaim_after=None`` (default), **at most once**: a claim whose outcome
  was never recorded is never taken over. A repeat raises
  :class:`~celery_fencing.EffectPendingError` instead of calling, and keeps
  raising it until the claim expires with *retention*. If the process died
  after the external call but before recording, the effect happened once and
  its outcome is lost; if it died before the call, the effect never happened.
  Either way nobody knows which without asking the external system:
  reconcile by hand (or through the API's own idempotency key, which
  :func:`run_once` can hand to the call).
* ``reclaim_after=seconds``, **at least once**: a claim older than that is
  presumed dead and the call is made again. The effect happens twice when the
  first call did land (the process died after it) or when the first
  execution was merely slower than *reclaim_after*.

No choice gives exactly once for an effect outside the store. Inside the
store it does: the Redis and SQL stores also record the key in the *same*
script or transaction as an effect on data they hold (``RedisIdempotencyStore.eval_once``,
``SQLIdempotencyStore.transaction_once``), which no crash can split.

Outcomes are stored as JSON; the first call returns the outcome after the
same JSON round trip, so first calls and repeats return equal values (a
tuple comes back as a list both times). *retention* bounds how long a key
suppresses repeats: make it longer than the longest time a duplicate can
arrive (retries with backoff, the broker's visibility timeout).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar, runtime_checkable

from ..context import current_execution
from ..exceptions import FencingConfigurationError
from ..values import seconds

__all__ = [
    "DEFAULT_RETENTION",
    "MAX_KEY_LENGTH",
    "Claim",
    "IdempotencyStore",
    "idempotency_key",
    "idempotent",
    "run_once",
    "validate_key",
]

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: Default retention of a key: one day, as payment APIs keep theirs.
DEFAULT_RETENTION = 24 * 3600.0
#: Longest key: a Celery task id (36 characters) and a long operation name fit easily.
MAX_KEY_LENGTH = 400


@dataclass(frozen=True)
class Claim:
    """The store's answer to a claim: either this caller now holds the key, or the effect is done.

    :param key: the idempotency key.
    :param claim_id: a random id naming this caller's claim; recording or
        forgetting checks it, so a claim taken over by someone else is left alone.
    :param done: the effect was already recorded; ``outcome`` holds it.
    :param outcome: the recorded outcome as JSON text (when ``done``).
    """

    key: str
    claim_id: str
    done: bool = False
    outcome: str | None = None


@runtime_checkable
class IdempotencyStore(Protocol):
    """Where idempotency keys and their outcomes live. Implementations: memory, Redis, SQL.

    Every operation is atomic at the store and uses the store's clock for ages
    and expiry, never the caller's.
    """

    def claim(self, key: str, *, retention: float, reclaim_after: float | None) -> Claim:
        """Claim *key*, or report its recorded outcome.

        A key that is absent, expired, or (with *reclaim_after*) claimed longer
        ago than that without an outcome is claimed for *retention* seconds.

        :raises EffectPendingError: another claim on *key* stands, without an outcome.
        """
        ...

    def record(self, claim: Claim, outcome: str, *, retention: float) -> bool:
        """Record *outcome* (JSON text) for a claim this caller holds; keep it *retention* seconds.

        Returns ``False`` (and records nothing) when the claim is no longer
        this caller's: it expired, or was taken over after *reclaim_after*.
        """
        ...

    def forget(self, claim: Claim) -> None:
        """Drop a claim this caller holds and has recorded nothing for (the call had no effect)."""
        ...


def validate_key(key: object) -> str:
    """Return *key* if it is a usable idempotency key, else raise.

    :raises FencingConfigurationError: not a non-empty ``str`` of at most
        :data:`MAX_KEY_LENGTH` characters without control characters.
    """
    if not isinstance(key, str) or not key:
        raise FencingConfigurationError(f"idempotency key must be a non-empty str, not {key!r:.60}")
    if len(key) > MAX_KEY_LENGTH:
        raise FencingConfigurationError(f"idempotency key is {len(key)} characters long; the limit is {MAX_KEY_LENGTH}")
    if any(ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0 for char in key):
        raise FencingConfigurationError(f"idempotency key {key!r:.60} contains a control character")
    return key


def _current_task_id() -> str | None:
    execution = current_execution()
    if execution is not None and execution.task_id:
        return execution.task_id
    # A plain (unfenced) Celery task: ask Celery, without importing it when the app did not.
    celery = sys.modules.get("celery")
    task = getattr(celery, "current_task", None) if celery is not None else None
    request = getattr(task, "request", None)
    task_id = getattr(request, "id", None)
    return str(task_id) if task_id else None


def idempotency_key(operation: str, task_id: str | None = None) -> str:
    """Return ``"<task id>:<operation>"``: one key per effect of one task, whatever its retries and re-deliveries.

    *task_id* defaults to the id of the Celery task running in this context
    (a fenced task's execution, else ``celery.current_task``). Name each
    distinct effect of a task with its own *operation* ("charge", "email:receipt").

    :raises FencingConfigurationError: no task is running and no *task_id* was given,
        or the key would be invalid.
    """
    if not isinstance(operation, str) or not operation:
        raise FencingConfigurationError(f"operation must be a non-empty str, not {operation!r:.60}")
    if task_id is None:
        task_id = _current_task_id()
        if task_id is None:
            raise FencingConfigurationError(
                f"no Celery task is running here to derive the idempotency key of {operation!r} from: "
                "pass task_id=, or key= to @idempotent"
            )
    return validate_key(f"{task_id}:{operation}")


def run_once(
    store: IdempotencyStore,
    key: str,
    call: Callable[[], T],
    *,
    retention: float = DEFAULT_RETENTION,
    reclaim_after: float | None = None,
    forget_on: tuple[type[BaseException], ...] = (),
) -> Any:
    """Make ``call()`` at most once per *key* (see the module docstring) and return its outcome.

    A repeat returns the first call's recorded outcome (decoded from JSON)
    without calling. An exception from ``call()`` propagates; when it is one
    of *forget_on* (errors that prove the call had no effect, such as a
    validation error the API answered with), the claim is dropped so a later
    attempt calls again; any other exception leaves the claim standing, since
    the effect may or may not have happened.

    :raises EffectPendingError: another execution claimed *key* and recorded no outcome (yet).
    :raises TypeError: the outcome is not JSON-serialisable (the call has
        happened; the claim stays, as after a crash).
    :raises FencingConfigurationError: bad key or durations.
    """
    validate_key(key)
    retention_s = seconds("retention", retention)
    assert retention_s is not None
    reclaim_s = None if reclaim_after is None else seconds("reclaim_after", reclaim_after)
    claim = store.claim(key, retention=retention_s, reclaim_after=reclaim_s)
    if claim.done:
        log.info("idempotency key %r: effect already done, returning its recorded outcome", key)
        return json.loads(claim.outcome) if claim.outcome is not None else None
    try:
        outcome = call()
    except forget_on:
        store.forget(claim)
        raise
    encoded = json.dumps(outcome, separators=(",", ":"))
    if not store.record(claim, encoded, retention=retention_s):
        log.warning(
            "idempotency key %r: the claim was taken over (reclaim_after=%s) or expired before the outcome "
            "was recorded; the effect may have happened more than once",
            key,
            reclaim_s,
        )
    return json.loads(encoded)


def idempotent(
    store: IdempotencyStore | Callable[[], IdempotencyStore],
    operation: str | None = None,
    *,
    key: Callable[..., str] | None = None,
    retention: float = DEFAULT_RETENTION,
    reclaim_after: float | None = None,
    forget_on: tuple[type[BaseException], ...] = (),
) -> Callable[[Callable[P, T]], Callable[P, Any]]:
    """Decorate a function with a side effect so that each task makes it at most once.

    ::

        store = RedisIdempotencyStore(redis.Redis())

        @idempotent(store, "charge")
        def charge(customer, amount):
            return payments.charge(customer, amount)       # an API that cannot check tokens

        @app.task(base=FencedTask)
        def checkout(customer, amount):
            receipt = charge(customer, amount)   # a retry or re-delivery gets the first receipt back
            ...

    The key is ``"<task id>:<operation>"`` (*operation* defaults to the
    function's qualified name), or ``key(*args, **kwargs)`` when given. *store*
    may be a zero-argument factory, called once per process (for clients that
    must not cross ``fork()``). Other parameters as for :func:`run_once`.
    """
    if key is not None and not callable(key):
        raise FencingConfigurationError(f"key must be a callable returning the key, not {key!r:.60}")
    seconds("retention", retention)
    if reclaim_after is not None:
        seconds("reclaim_after", reclaim_after)
    resolve = _store_resolver(store)

    def decorate(function: Callable[P, T]) -> Callable[P, Any]:
        name = operation or f"{function.__module__}.{function.__qualname__}"

        @functools.wraps(function)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            effect_key = key(*args, **kwargs) if key is not None else idempotency_key(name)
            return run_once(
                resolve(),
                effect_key,
                lambda: function(*args, **kwargs),
                retention=retention,
                reclaim_after=reclaim_after,
                forget_on=forget_on,
            )

        return wrapper

    return decorate


def _store_resolver(store: IdempotencyStore | Callable[[], IdempotencyStore]) -> Callable[[], IdempotencyStore]:
    if isinstance(store, IdempotencyStore):
        return lambda: store
    if not callable(store):
        raise FencingConfigurationError(f"store must be an idempotency store or a factory, not {store!r:.60}")
    factory = store
    lock = threading.Lock()
    built: dict[int, IdempotencyStore] = {}

    def resolve() -> IdempotencyStore:
        pid = os.getpid()
        with lock:
            if pid not in built:
                built.clear()  # a forked child never uses its parent's store
                built[pid] = factory()
            return built[pid]

    return resolve
