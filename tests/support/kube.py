"""A local server that answers like the Kubernetes API server, from the
recorded pod list and watch events in tests/fixtures/kube."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import parse_qs, urlparse

from . import FIXTURES

KUBE = FIXTURES / "kube"


class FakeApiServer(BaseHTTPRequestHandler):
    """GET /api/v1/pods: the recorded list, or with watch=1 the recorded
    events (then the stream ends, as a server-side timeout would)."""

    requests: ClassVar[list[tuple[dict[str, list[str]], str]]] = []
    fail_next = 0

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        type(self).requests.append((query, self.headers.get("Authorization", "")))
        if url.path != "/api/v1/pods":
            self.send_error(404)
            return
        if type(self).fail_next:
            type(self).fail_next -= 1
            self.send_error(500, "etcd unavailable")
            return
        body = (KUBE / ("watch.jsonl" if query.get("watch") == ["1"] else "pods.json")
                ).read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass



@contextmanager
def fake_api_server() -> Iterator[str]:
    """The server's URL while it runs."""
    FakeApiServer.requests = []
    FakeApiServer.fail_next = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
