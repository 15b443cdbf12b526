"""ConditionalHTTPClient against a real HTTP server on loopback (tests/sinks/fake_services.py)."""

from __future__ import annotations

import json
import pickle
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from celery_fencing import (
    EffectPendingError,
    FencingConfigurationError,
    FencingToken,
    GateUnavailableError,
    InvalidTokenError,
    StaleETagError,
    StaleTokenError,
    token_context,
)
from celery_fencing.gates.http import ConditionalHTTPClient

from .fake_services import ExternalService


@pytest.fixture
def service() -> Iterator[ExternalService]:
    running = ExternalService().start()
    yield running
    running.close()


def _blind_put(url: str, value: object) -> None:
    request = urllib.request.Request(url, data=json.dumps(value).encode(), method="PUT")
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def _add(amount: int) -> Callable[[Any], Any]:
    return lambda doc: {"total": doc["total"] + amount}


def test_updates_in_turn_each_see_the_last(service: ExternalService) -> None:
    """Sequential read-modify-writes all land, each with a new ETag."""
    client = ConditionalHTTPClient()
    url = f"{service.url}/docs/acct"
    _, first = client.update_json(url, lambda doc: doc, create={"total": 100})
    _, second = client.update_json(url, _add(10))
    assert first != second
    assert service.document("acct") == {"total": 110}


def test_the_paused_writer_gets_412_and_changes_nothing(service: ExternalService) -> None:
    """A writer whose read is outdated gets StaleETagError (a StaleTokenError) carrying the ETags and its token."""
    client = ConditionalHTTPClient()
    url = f"{service.url}/docs/acct"
    client.put_json(url, {"total": 100}, if_none_match="*")
    read_by_a = client.get(url)
    assert read_by_a is not None and read_by_a.etag is not None
    client.update_json(url, _add(20))  # B, while A is paused
    with token_context(FencingToken("account:42", 7)), pytest.raises(StaleETagError) as caught:
        client.put_json(url, {"total": read_by_a.json()["total"] + 10}, if_match=read_by_a.etag)
    error = caught.value
    assert isinstance(error, StaleTokenError)
    assert (error.url, error.etag, error.current_etag) == (url, read_by_a.etag, '"2"')
    assert (error.resource, error.token, error.high_water) == ("account:42", 7, None)
    assert service.document("acct") == {"total": 120}
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is StaleETagError and vars(copy) == vars(error)


def test_without_if_match_the_paused_writer_destroys_the_newer_write(service: ExternalService) -> None:
    """Negative control: the same schedule with a plain PUT loses B's deposit."""
    client = ConditionalHTTPClient()
    url = f"{service.url}/docs/acct"
    client.put_json(url, {"total": 100}, if_none_match="*")
    read_by_a = client.get(url)
    assert read_by_a is not None
    client.update_json(url, _add(20))
    _blind_put(url, {"total": read_by_a.json()["total"] + 10})
    assert service.document("acct") == {"total": 110}


def test_create_only_refuses_an_existing_resource(service: ExternalService) -> None:
    """If-None-Match: * creates once; a second create gets 412."""
    client = ConditionalHTTPClient()
    url = f"{service.url}/docs/new"
    assert client.put_json(url, {"n": 1}, if_none_match="*") == '"1"'
    with pytest.raises(StaleETagError):
        client.put_json(url, {"n": 2}, if_none_match="*")
    assert service.document("new") == {"n": 1}


@pytest.mark.parametrize(
    ("condition", "message"),
    [
        ({}, "exactly one"),
        ({"if_match": '"1"', "if_none_match": "*"}, "exactly one"),
        ({"if_match": 'W/"1"'}, "strong"),
    ],
)
def test_writes_without_a_usable_condition_are_refused_before_any_io(
    service: ExternalService, condition: dict[str, str], message: str
) -> None:
    """No condition, two conditions or a weak ETag: a configuration error, and the server sees nothing."""
    with pytest.raises(FencingConfigurationError, match=message):
        ConditionalHTTPClient().put_json(f"{service.url}/docs/x", {"n": 1}, **condition)
    assert not service.documents and not service.refused


def test_the_token_header_carries_the_current_token(service: ExternalService) -> None:
    """With token_header, each write carries the execution's token value; with no token there is no write."""
    client = ConditionalHTTPClient(token_header="Fencing-Token")
    url = f"{service.url}/docs/t"
    with token_context(FencingToken("doc:t", 41)):
        client.update_json(url, lambda doc: doc, create={"n": 0})
    assert service.tokens_seen == ["41"]
    with pytest.raises(InvalidTokenError):
        client.put_json(url, {"n": 1}, if_match='"1"')
    assert service.document("t") == {"n": 0}


def test_a_missing_resource_reads_as_none_and_needs_create(service: ExternalService) -> None:
    """A 404 reads as None; update_json on it needs a create= value to start from."""
    client = ConditionalHTTPClient()
    assert client.get(f"{service.url}/docs/none") is None
    with pytest.raises(FencingConfigurationError, match="create="):
        client.update_json(f"{service.url}/docs/none", lambda doc: doc)


class _NoETagHandler(BaseHTTPRequestHandler):
    """Serves a JSON document without an ETag: a resource that cannot take conditional writes."""

    def do_GET(self) -> None:
        body = b'{"n": 1}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_resource_without_an_etag_is_not_written_blindly() -> None:
    """update_json refuses a resource served without an ETag instead of writing without a condition."""
    server = HTTPServer(("127.0.0.1", 0), _NoETagHandler)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        with pytest.raises(FencingConfigurationError, match="without an ETag"):
            ConditionalHTTPClient().update_json(f"http://127.0.0.1:{server.server_address[1]}/doc", lambda doc: doc)
    finally:
        thread.join(10)
        server.server_close()


def test_an_unreachable_service_is_gate_unavailable() -> None:
    """A refused connection is GateUnavailableError with the urllib error chained."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(GateUnavailableError) as caught:
        ConditionalHTTPClient(timeout=5).put_json(f"http://127.0.0.1:{port}/docs/x", {}, if_none_match="*")
    assert caught.value.__cause__ is not None


def test_effect_pending_error_survives_pickle() -> None:
    """EffectPendingError keeps its key and age through pickle and cls(*args)."""
    error = EffectPendingError(key="task-1:charge", age=2.5)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is EffectPendingError and vars(copy) == vars(error)
    assert str(type(error)(*error.args)) == str(error)
