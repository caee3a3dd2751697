"""The HTTP server behind the agent's /metrics and the collector's API and
web UI: a router function returns (status, body, content type); this module
does the rest, optionally over TLS.

The server is Hypercorn (asyncio), run in one background thread with its own
event loop, never installing signal handlers (the daemons own SIGINT, SIGTERM
and SIGHUP). It was chosen for what the standard library's server lacked:
TLS handshakes happen on the event loop, each under a timeout, so idle
connections cannot block the accept path; a connection must send its request
headers within IDLE_TIMEOUT (slowloris); the listen queue is deep.

Routers are plain blocking functions: they run in a bounded thread pool,
and a request that finds every worker busy and the small queue full is
answered 503 with Retry-After instead of waiting without bound. A router
learns that its client went away through ``check_cancelled()``.

And its client side, ``fetch``: one GET with the collector's bearer token and
CA, whose failures become ember's errors carrying the server's own reason
(the collector answers errors as JSON ``{"error": ...}``)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import http.client
import json
import logging
import os
import queue
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qs, urlparse

from .errors import ConfigError, EmberError, UsageError

if TYPE_CHECKING:
    from hypercorn.typing import ASGIFramework

log = logging.getLogger(__name__)

Reply = tuple[int, bytes, str]
#: (path, query parameters, Authorization header) -> reply
Router = Callable[[str, dict[str, list[str]], str], Reply]

#: Seconds a connection may stay silent: before and between requests, and
#: while sending a request's headers (a client dribbling them is cut off).
IDLE_TIMEOUT = 5.0
#: Seconds a client has to complete the TLS handshake.
HANDSHAKE_TIMEOUT = 5.0
#: Seconds running requests get to finish when the server shuts down.
GRACE = 2.0
#: Connections the kernel queues before they are accepted.
BACKLOG = 128
#: Seconds a client answered 503 is asked to wait before retrying.
RETRY_AFTER = 1

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

class CancelFlag(threading.Event):
    """A request's cancel flag: set when its client goes away, and then
    runs what the request registered with ``on_cancel`` (a query running
    in a database stops at once, not at the next ``check_cancelled``)."""

    def __init__(self) -> None:
        super().__init__()
        self._hooks_lock = threading.Lock()
        self._hooks: list[Callable[[], object]] = []

    def set(self) -> None:
        super().set()
        with self._hooks_lock:
            hooks = list(self._hooks)
        for hook in hooks:
            try:
                hook()
            except Exception:  # a hook's failure must not stop the others
                log.exception("a cancel hook failed")


_cancel: contextvars.ContextVar[threading.Event] = contextvars.ContextVar("ember_http_cancel")


class Cancelled(Exception):
    """The client of the running request went away: its answer would be
    thrown away, so the work stops."""


@contextlib.contextmanager
def on_cancel(hook: Callable[[], object]) -> Iterator[None]:
    """Within the block, ``hook`` runs (in another thread) if the client of
    the request this thread answers goes away; outside a request, never.
    Cancelled at once if the client already left."""
    flag = _cancel.get(None)
    if not isinstance(flag, CancelFlag):
        yield
        return
    with flag._hooks_lock:
        flag._hooks.append(hook)
    try:
        check_cancelled()
        yield
    finally:
        with flag._hooks_lock:
            flag._hooks.remove(hook)


def check_cancelled() -> None:
    """Raise Cancelled if the client of the request this thread is answering
    has disconnected (or the server is shutting down). Long loops call it so
    abandoned queries stop; outside a request it does nothing."""
    event = _cancel.get(None)
    if event is not None and event.is_set():
        raise Cancelled


@contextlib.contextmanager
def holding(lock: threading.Lock) -> Iterator[None]:
    """``lock`` held for the block; a request whose client leaves while it
    waits for the lock stops waiting (Cancelled)."""
    while not lock.acquire(timeout=0.05):
        check_cancelled()
    try:
        yield
    finally:
        lock.release()


class Server:
    """A running HTTP server: ``server_address`` (host, port) as bound, and
    ``shutdown()`` / ``server_close()``, the names callers of the standard
    library's servers know; both stop it, and both may be called twice."""

    def __init__(self, sock: socket.socket, router: Router, what: str,
                 tls: ssl.SSLContext | None, on_reply: Callable[[int], None] | None,
                 workers: int, queue: int):
        self.server_address: tuple[str, int] = sock.getsockname()[:2]
        self._app = _App(router, on_reply, what, workers, queue)
        self._config = _config(sock, tls)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ember-http-{what}",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:
            log.exception("HTTP server %s stopped", self._thread.name)
        finally:
            self._ready.set()

    async def _main(self) -> None:
        from hypercorn.asyncio import serve as hypercorn_serve

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        # a shutdown_trigger keeps Hypercorn from installing signal handlers
        await hypercorn_serve(cast("ASGIFramework", self._app), self._config,
                              shutdown_trigger=self._stop.wait, mode="asgi")

    def shutdown(self) -> None:
        """Stop accepting, tell running routers their clients are gone, and
        wait up to GRACE seconds for them."""
        self._app.cancel_all()
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(GRACE + 5)
        self._app.pool.stop()

    def server_close(self) -> None:
        self.shutdown()


def serve(listen: str, router: Router, what: str, tls: ssl.SSLContext | None = None,
          on_reply: Callable[[int], None] | None = None, workers: int = 8) -> Server:
    """Serve GETs on listen (HOST:PORT) with router, in the background.
    ``workers`` routers run at once and as many more requests wait; beyond
    that the answer is 503. ``on_reply(status)`` hears of every answer.
    ConfigError names the setting ``what`` when the port cannot be bound."""
    host, port = listen.rsplit(":", 1)
    host = host.strip("[]")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, int(port)), family=family, backlog=BACKLOG)
    except socket.gaierror as exc:  # a host name that does not resolve
        raise ConfigError(f"{what} {listen}: {exc.strerror}") from exc
    except OSError as exc:  # create_server's own message adds the address again
        raise ConfigError(f"{what} {listen}: {os.strerror(exc.errno or 0)}") from exc
    except ValueError:
        raise ConfigError(f"{what} {listen}: not HOST:PORT") from None
    return Server(sock, router, what, tls, on_reply, workers, queue=workers)


def _config(sock: socket.socket, tls: ssl.SSLContext | None) -> Any:
    """Hypercorn's settings: the already bound socket (handed over by file
    descriptor, so bind errors stay ours), the caller's TLS context, the
    timeouts above, and its own log lines kept at warning and up (its info
    lines are written for its command line)."""
    from hypercorn.config import Config

    class _Config(Config):
        @property
        def ssl_enabled(self) -> bool:
            return tls is not None

        def create_ssl_context(self) -> ssl.SSLContext | None:
            return tls

    config = _Config()
    config.bind = [f"fd://{sock.detach()}"]
    config.backlog = BACKLOG
    config.keep_alive_timeout = IDLE_TIMEOUT
    config.ssl_handshake_timeout = HANDSHAKE_TIMEOUT
    config.graceful_timeout = GRACE
    config.include_server_header = False
    config.accesslog = None
    config.errorlog = _server_log
    return config


_server_log = logging.getLogger(f"{__name__}.server")
_server_log.setLevel(logging.WARNING)


class _App:
    """The ASGI application: each GET goes to the router in the pool, while
    the event loop watches for the client leaving."""

    def __init__(self, router: Router, on_reply: Callable[[int], None] | None, what: str,
                 workers: int, queue: int):
        self.router = router
        self.on_reply = on_reply
        self.pool = _Pool(workers, f"ember-http-{what}")
        self.limit = workers + queue
        self.running: set[threading.Event] = set()  # one cancel flag per admitted request

    def cancel_all(self) -> None:
        for event in self.running.copy():
            event.set()

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})

    async def _http(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            await self._reply(send, method, _error(405, f"{method} is not served"),
                              [(b"allow", b"GET, HEAD")])
            return
        if len(self.running) >= self.limit:
            await self._reply(send, method, _error(503, "busy, try again"),
                              [(b"retry-after", str(RETRY_AFTER).encode())])
            return
        # the path as sent (not percent-decoded), as the routers always saw it
        path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        query = parse_qs(scope["query_string"].decode("latin-1"), keep_blank_values=True)
        auth = next((v.decode("latin-1") for k, v in scope["headers"]
                     if k == b"authorization"), "")
        cancel = CancelFlag()
        self.running.add(cancel)
        work = self.pool.submit(lambda: self._call(cancel, path, query, auth))
        # the worker stays counted until the router returns, whoever waits
        work.add_done_callback(lambda _: self.running.discard(cancel))
        watch = asyncio.ensure_future(_disconnected(receive, cancel))
        try:
            reply = await asyncio.shield(work)
        except asyncio.CancelledError:
            cancel.set()
            raise
        finally:
            watch.cancel()
        if reply is not None and not cancel.is_set():
            await self._reply(send, method, reply)

    def _call(self, cancel: threading.Event, path: str, query: dict[str, list[str]],
              auth: str) -> Reply | None:
        """The router's reply, in a pool thread; None when it stopped
        because its client left."""
        token = _cancel.set(cancel)
        try:
            return self.router(path, query, auth)
        except Cancelled:
            log.debug("HTTP %s: the client went away", path)
            return None
        except Exception as exc:  # never let a request take the server down
            log.exception("HTTP %s failed", path)
            return _error(500, str(exc))
        finally:
            _cancel.reset(token)

    async def _reply(self, send: _Send, method: str, reply: Reply,
                     extra: list[tuple[bytes, bytes]] | None = None) -> None:
        code, body, ctype = reply
        if self.on_reply is not None:
            self.on_reply(code)
        headers = [(b"content-type", ctype.encode("latin-1")),
                   (b"content-length", str(len(body)).encode()), *(extra or [])]
        await send({"type": "http.response.start", "status": code, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


class _Pool:
    """Worker threads for the routers. Daemon threads, unlike
    ThreadPoolExecutor's, which the interpreter waits for at exit: a query
    that never checks for cancellation must not hold up a daemon's exit.

    A job goes to the worker that went idle last, so requests one at a
    time are all answered by one thread, whose malloc heap still holds
    what its last answer freed. Taken in turns (one queue every worker
    waited on), each went to another thread, whose heap had given that
    memory back: one host's answer took 44-48 ms in-process against 31-43,
    with 1,300-1,950 page faults against 240. Jobs that find every worker
    busy wait in order of arrival."""

    def __init__(self, workers: int, name: str):
        self.workers = workers
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Callable[[], None] | None]] = []   # last idle last
        self._waiting: collections.deque[Callable[[], None]] = collections.deque()
        self._stopped = False
        for i in range(workers):
            mine: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
            self._idle.append(mine)
            threading.Thread(target=self._work, args=(mine,), name=f"{name}-{i}",
                             daemon=True).start()

    def _work(self, mine: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        job = mine.get()
        while job is not None:
            job()
            with self._lock:
                if self._waiting:
                    job = self._waiting.popleft()
                    continue
                if self._stopped:
                    return
                self._idle.append(mine)
            job = mine.get()

    def _put(self, job: Callable[[], None]) -> None:
        with self._lock:
            if not self._idle:
                self._waiting.append(job)
                return
            worker = self._idle.pop()
        worker.put(job)

    def submit(self, call: Callable[[], Reply | None]) -> asyncio.Future[Reply | None]:
        """A future, of the running loop, for what call returns (it must not
        raise)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply | None] = loop.create_future()

        def done(result: Reply | None) -> None:
            if not future.done():
                future.set_result(result)

        def job() -> None:
            result = call()
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(done, result)

        self._put(job)
        return future

    def stop(self) -> None:
        """The workers end once no job waits (those running finish theirs)."""
        with self._lock:
            self._stopped = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.put(None)


async def _disconnected(receive: _Receive, cancel: threading.Event) -> None:
    """Set cancel when the client disconnects (the request's body, if any,
    is read and ignored: every route is a GET)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    cancel.set()


async def _lifespan(receive: _Receive, send: _Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _error(code: int, msg: str) -> Reply:
    return code, json.dumps({"error": msg}).encode(), "application/json"


#: The largest answer fetch() reads unless told otherwise.
MAX_ANSWER = 1 << 30


def fetch(url: str, token: str = "", cafile: str | None = None, timeout: float = 60.0,
          max_bytes: int = MAX_ANSWER) -> bytes:
    """The body of a GET of url, sent with ``Authorization: Bearer token``
    when a token is given, checking an https server against cafile when one
    is given (the system's CAs otherwise), read up to max_bytes.

    Raises EmberError: ``collector answered CODE: MSG`` for an HTTP error
    (MSG from its JSON ``error``, else the reason phrase), ``cannot reach
    SCHEME://HOST: REASON`` when there is no answer or not HTTP (a gRPC
    port), an answer over max_bytes; UsageError for what is not an http(s)
    URL; ConfigError when cafile cannot be used."""
    origin = _origin(url)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    context = _tls(cafile)
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            body = bytes(resp.read(max_bytes + 1))
    except urllib.error.HTTPError as exc:
        raise EmberError(f"collector answered {exc.code}: {_error_message(exc)}") from None
    except (ValueError, http.client.InvalidURL) as exc:  # e.g. a port that is not a number
        raise UsageError(f"not a valid URL: {url} ({exc})") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or exc
        if isinstance(exc, http.client.BadStatusLine):
            reason = "it does not answer HTTP (a gRPC port?)"
        raise EmberError(f"cannot reach {origin}: {reason}") from None
    if len(body) > max_bytes:
        raise EmberError(f"{origin}: the answer is larger than {max_bytes} bytes")
    return body


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
    """The JSON ``error`` of an error answer, else its reason phrase (the
    standard one when the server sent none, as HTTP/2-era servers do)."""
    reason = str(exc.reason or http.client.responses.get(exc.code, ""))
    try:
        body = json.loads(exc.read())
    except (ValueError, OSError):
        return reason
    return str(body.get("error", reason)) if isinstance(body, dict) else reason
