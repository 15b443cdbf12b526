"""celery-fencing: fencing tokens that make Celery tasks safe against stale workers.

A grantor (ZooKeeper) mints a strictly increasing token for each execution of a
fenced task; every protected write carries it, and the storage (a gate) refuses
any token below the highest it has accepted. A worker that was paused, or whose
task was re-delivered, can no longer overwrite newer data.

Importing this package imports no driver (celery, kazoo, redis, sqlalchemy, django):
driver-backed names are loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _lazy
from ._version import __version__
from .context import current_token, resolve_token, token_context
from .exceptions import (
    AlreadyAppliedError,
    BelowFloorError,
    EffectPendingError,
    FencingConfigurationError,
    FencingError,
    ForgedTokenError,
    GateUnavailableError,
    GrantorMismatchError,
    InvalidArgumentError,
    InvalidTokenError,
    LeaseLostError,
    ResourceMismatchError,
    StaleETagError,
    StaleTokenError,
    StoreUnarmedError,
    TokenUnavailableError,
)
from .gates.memory import MemoryGate
from .policies import (
    Decision,
    DeferPolicy,
    ExponentialBackoff,
    IgnorePolicy,
    RaisePolicy,
    RejectPolicy,
    RetryPolicy,
    StaleState,
)
from .protocols import Gate, TokenSource, TokenVerifier
from .signing import PlausibilityBound, TokenSigner
from .sources import token_source_from_url
from .sources.memory import MemoryTokenSource
from .sources.sqlite import SQLiteTokenSource
from .token import MAX_TOKEN_VALUE, FencingToken

if TYPE_CHECKING:
    from .celery.decorator import fenced_task
    from .celery.task import FencedTask
    from .celery.worker import install
    from .gates.django import DjangoGate
    from .gates.redis import RedisGate
    from .gates.sql import SQLGate
    from .sources.etcd import EtcdTokenSource
    from .sources.zookeeper import ZooKeeperTokenSource

__all__ = [
    "AlreadyAppliedError",
    "BelowFloorError",
    "Decision",
    "DeferPolicy",
    "DjangoGate",
    "EffectPendingError",
    "EtcdTokenSource",
    "ExponentialBackoff",
    "FencedTask",
    "FencingConfigurationError",
    "FencingError",
    "FencingToken",
    "ForgedTokenError",
    "Gate",
    "GateUnavailableError",
    "GrantorMismatchError",
    "IgnorePolicy",
    "InvalidArgumentError",
    "InvalidTokenError",
    "LeaseLostError",
    "MAX_TOKEN_VALUE",
    "MemoryGate",
    "MemoryTokenSource",
    "PlausibilityBound",
    "RaisePolicy",
    "RedisGate",
    "RejectPolicy",
    "ResourceMismatchError",
    "RetryPolicy",
    "SQLGate",
    "SQLiteTokenSource",
    "StaleETagError",
    "StaleState",
    "StaleTokenError",
    "StoreUnarmedError",
    "TokenSigner",
    "TokenSource",
    "TokenUnavailableError",
    "TokenVerifier",
    "ZooKeeperTokenSource",
    "__version__",
    "current_token",
    "fenced_task",
    "install",
    "resolve_token",
    "token_context",
    "token_source_from_url",
]

# Names whose modules import a driver: resolved on first access (PEP 562). A new
# driver-backed name goes here, into __all__, and under TYPE_CHECKING above.
_LAZY: dict[str, str] = {
    "DjangoGate": "celery_fencing.gates.django",
    "FencedTask": "celery_fencing.celery.task",
    "fenced_task": "celery_fencing.celery.decorator",
    "install": "celery_fencing.celery.worker",
    "EtcdTokenSource": "celery_fencing.sources.etcd",
    "RedisGate": "celery_fencing.gates.redis",
    "SQLGate": "celery_fencing.gates.sql",
    "ZooKeeperTokenSource": "celery_fencing.sources.zookeeper",
}


__getattr__ = _lazy.lazy_names(__name__, _LAZY, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
