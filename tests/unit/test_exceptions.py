"""The exception hierarchy: one root, fields carried, pickle and Celery round trips."""

from __future__ import annotations

import pickle

import pytest

import celery_fencing
from celery_fencing import exceptions

ALL = [getattr(exceptions, name) for name in exceptions.__all__]

EXAMPLES = [
    exceptions.StaleTokenError(resource="acct:1", token=33, high_water=34),
    exceptions.ResourceMismatchError("mismatch", token_resource="a", expected_resource="b"),
    exceptions.TokenUnavailableError("zk down", resource="r"),
    exceptions.GateUnavailableError("redis down", gate="RedisGate"),
    exceptions.LeaseLostError("gone", resource="r"),
    exceptions.InvalidTokenError("bad"),
    exceptions.FencingConfigurationError("bad url"),
]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_exception_derives_from_root_and_is_named_error(cls: type) -> None:
    """Callers catch everything with FencingError; names end in Error and shadow no builtin."""
    assert issubclass(cls, exceptions.FencingError)
    assert cls.__name__.endswith("Error")
    assert cls.__name__ not in dir(__builtins__)


@pytest.mark.parametrize("exc", EXAMPLES, ids=lambda e: type(e).__name__)
def test_exceptions_survive_pickle(exc: exceptions.FencingError) -> None:
    """Celery stores exceptions in result backends: type, message and fields survive pickle."""
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is type(exc)
    assert str(copy) == str(exc)
    assert vars(copy) == vars(exc)


@pytest.mark.parametrize("exc", EXAMPLES, ids=lambda e: type(e).__name__)
def test_exceptions_rebuild_from_args(exc: exceptions.FencingError) -> None:
    """Celery's JSON serialiser rebuilds an exception as cls(*args): that must work."""
    assert str(type(exc)(*exc.args)) == str(exc)


def test_stale_token_error_names_its_fields() -> None:
    """The default message names the resource, the token and the mark."""
    exc = exceptions.StaleTokenError(resource="acct:1", token=33, high_water=34)
    assert (exc.resource, exc.token, exc.high_water) == ("acct:1", 33, 34)
    assert "33" in str(exc) and "34" in str(exc) and "acct:1" in str(exc)


def test_public_exceptions_are_exported() -> None:
    """Every exception is importable from the package root."""
    for name in exceptions.__all__:
        assert getattr(celery_fencing, name) is getattr(exceptions, name)


def test_a_bad_argument_is_not_a_bad_token() -> None:
    """``except InvalidTokenError`` is about tokens: a bad Redis key (InvalidArgumentError) passes through it."""
    assert not issubclass(exceptions.InvalidArgumentError, exceptions.InvalidTokenError)
    assert issubclass(exceptions.InvalidArgumentError, (TypeError, ValueError))
    with pytest.raises(exceptions.InvalidArgumentError):
        try:
            raise exceptions.InvalidArgumentError("key must not be empty")
        except exceptions.InvalidTokenError:  # pragma: no cover - the point: this clause must not catch it
            pytest.fail("a bad argument was caught as a bad token")
