"""The small HTTP server behind the agent's /metrics and the collector's API:
a router function returns (status, body, content type); this module does
the rest, in daemon threads, optionally over TLS.

And its client side, ``fetch``: one GET with the collector's bearer token and
CA, whose failures become ember's errors carrying the server's own reason
(the collector answers errors as JSON ``{"error": ...}``)."""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from .errors import ConfigError, EmberError, UsageError

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


def fetch(url: str, token: str = "", cafile: str | None = None, timeout: float = 60.0) -> bytes:
    """The body of a GET of url, sent with ``Authorization: Bearer token``
    when a token is given, checking an https server against cafile when one
    is given (the system's CAs otherwise).

    Raises EmberError: ``collector answered CODE: MSG`` for an HTTP error
    (MSG from its JSON ``error``, else the reason phrase), ``cannot reach
    SCHEME://HOST: REASON`` when there is no answer; UsageError for what is
    not an http(s) URL; ConfigError when cafile cannot be used."""
    origin = _origin(url)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    context = _tls(cafile)
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return bytes(resp.read())
    except urllib.error.HTTPError as exc:
        raise EmberError(f"collector answered {exc.code}: {_error_message(exc)}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise EmberError(f"cannot reach {origin}: {getattr(exc, 'reason', exc)}") from None
    except (ValueError, http.client.InvalidURL) as exc:  # e.g. a port that is not a number
        raise UsageError(f"not a valid URL: {url} ({exc})") from None


def _origin(url: str) -> str:
    """SCHEME://HOST[:PORT] of an http(s) URL; UsageError for anything else."""
    try:
        where = urlparse(url)
    except ValueError as exc:  # an unclosed IPv6 bracket
        raise UsageError(f"not a valid URL: {url} ({exc})") from None
    if where.scheme not in ("http", "https") or not where.netloc:
        raise UsageError(f"not an http or https URL: {url}")
    return f"{where.scheme}://{where.netloc}"


def _tls(cafile: str | None) -> ssl.SSLContext | None:
    if not cafile:
        return None
    try:
        return ssl.create_default_context(cafile=cafile)
    except OSError as exc:  # missing, unreadable, or not PEM (ssl.SSLError)
        raise ConfigError(f"{cafile}: cannot use CA certificate: "
                          f"{exc.strerror or exc}") from None


def _error_message(exc: urllib.error.HTTPError) -> str:
    """The JSON ``error`` of an error answer, else its reason phrase."""
    try:
        body = json.loads(exc.read())
    except (ValueError, OSError):
        return str(exc.reason)
    return str(body.get("error", exc.reason)) if isinstance(body, dict) else str(exc.reason)
