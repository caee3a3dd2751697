"""The small HTTP server behind the agent's /metrics and the collector's API:
a router function returns (status, body, content type); this module does
the rest, in daemon threads, optionally over TLS."""

from __future__ import annotations

import json
import logging
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from .errors import ConfigError

log = logging.getLogger(__name__)

Reply = tuple[int, bytes, str]
#: (path, query parameters, Authorization header) -> reply
Router = Callable[[str, dict[str, list[str]], str], Reply]


def serve(listen: str, router: Router, what: str, tls: ssl.SSLContext | None = None,
          on_reply: Callable[[int], None] | None = None) -> ThreadingHTTPServer:
    host, port = listen.rsplit(":", 1)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            try:
                code, body, ctype = router(url.path, parse_qs(url.query, keep_blank_values=True),
                                           self.headers.get("Authorization", ""))
            except Exception as exc:  # never let a request take the server down
                log.exception("HTTP %s failed", self.path)
                code, body, ctype = 500, json.dumps({"error": str(exc)}).encode(), \
                    "application/json"
            if on_reply is not None:
                on_reply(code)
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("http: " + fmt, *args)

    try:
        server = ThreadingHTTPServer((host, int(port)), Handler)
    except OSError as exc:
        raise ConfigError(f"{what} {listen}: {exc.strerror}") from exc
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=f"ember-http-{what}",
                     daemon=True).start()
    return server
