"""A tiny external service on loopback, written for these tests: JSON documents with ETags, and a payment API.

* ``GET /docs/<name>``: the document, with a strong ETag (``"<version>"``); 404 if absent.
* ``PUT /docs/<name>``: ``If-Match`` must equal the current ETag, ``If-None-Match: *``
  requires the document to be absent; otherwise ``412`` with the current ETag. A
  PUT without either condition overwrites blindly (what a plain client does).
  Every write records the ``Fencing-Token`` header it carried, if any.
* ``POST /charges``: counts the call and answers ``{"id": "ch_<n>", ...}``: a
  sink that cannot check anything, where only the count tells duplicates.

It runs in a thread of the test process (``ThreadingHTTPServer`` on 127.0.0.1,
port 0), so worker processes reach it by URL and the test reads its counters directly.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ExternalService:
    """The service's state, shared by its request threads under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.documents: dict[str, tuple[int, Any]] = {}
        self.charges: list[dict[str, Any]] = []
        self.refused: list[str] = []
        self.tokens_seen: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        # A short poll interval: shutdown() waits for the serving loop's next look.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-external-service", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ExternalService:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def document(self, name: str) -> Any:
        with self.lock:
            return self.documents[name][1]

    def charge_count(self) -> int:
        with self.lock:
            return len(self.charges)


def _handler(service: ExternalService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: pytest shows failures
            pass

        def _reply(self, status: int, body: Any = None, etag: str | None = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            if etag is not None:
                self.send_header("ETag", etag)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length)) if length else None

        def do_GET(self) -> None:
            name = self.path.removeprefix("/docs/")
            with service.lock:
                entry = service.documents.get(name)
            if not self.path.startswith("/docs/") or entry is None:
                self._reply(404, {"error": "not found"})
                return
            self._reply(200, entry[1], etag=f'"{entry[0]}"')

        def do_PUT(self) -> None:
            if not self.path.startswith("/docs/"):
                self._reply(404, {"error": "not found"})
                return
            name = self.path.removeprefix("/docs/")
            value = self._body()
            if_match, if_none_match = self.headers.get("If-Match"), self.headers.get("If-None-Match")
            with service.lock:
                current = service.documents.get(name)
                etag = f'"{current[0]}"' if current is not None else None
                stale = (if_match is not None and if_match != etag) or (if_none_match == "*" and current is not None)
                if stale:
                    service.refused.append(f"{name} If-Match {if_match} If-None-Match {if_none_match}")
                else:
                    version = (current[0] if current is not None else 0) + 1
                    service.documents[name] = (version, value)
                    if self.headers.get("Fencing-Token"):
                        service.tokens_seen.append(self.headers["Fencing-Token"])
            if stale:
                self._reply(412, {"error": "precondition failed"}, etag=etag)
            else:
                self._reply(200 if current is not None else 201, value, etag=f'"{version}"')

        def do_POST(self) -> None:
            if self.path != "/charges":
                self._reply(404, {"error": "not found"})
                return
            request = self._body() or {}
            with service.lock:
                charge = {"id": f"ch_{len(service.charges) + 1}", **request}
                service.charges.append(charge)
            self._reply(201, charge)

    return Handler
