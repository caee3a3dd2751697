#!/usr/bin/env python3
"""What serving HTTP with Hypercorn (ember.httpserve) costs against the
standard library's ThreadingHTTPServer it replaced, same router, same run:
rounds alternate between the two, each server in a process of its own, the
clients in this one. Figures: one client's request latency (a new
connection per request, as Prometheus and probes do), 16 clients' requests
per second, and one client's latency while 10 idle TCP connections are
open on the HTTPS port (the old server blocks there: reported as such).

    .venv/bin/python bench/http_server.py [--rounds 5] [--requests 400]
"""

from __future__ import annotations

import argparse
import http.client
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from common import free_port, render

BODY = b"x" * 2048


def router(path: str, query: dict[str, list[str]], auth: str) -> tuple[int, bytes, str]:
    if path == "/work":  # a small query: about 2 ms of Python
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass
    return 200, BODY, "text/plain"


def serve_stdlib(port: int, tls: ssl.SSLContext | None) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code, body, ctype = router(self.path, {}, "")
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    server.serve_forever()


def serve_hypercorn(port: int, tls: ssl.SSLContext | None) -> None:
    from ember.httpserve import serve

    serve(f"127.0.0.1:{port}", router, "bench", tls)
    threading.Event().wait()


def child(kind: str, port: int, cert: str, key: str) -> None:
    tls = None
    if cert:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, key)
    (serve_stdlib if kind == "stdlib" else serve_hypercorn)(port, tls)


def start(kind: str, cert: str = "", key: str = "") -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, str(port), cert, key])
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{kind} did not start")


def get(port: int, path: str, tls: ssl.SSLContext | None = None,
        timeout: float = 10) -> None:
    conn: http.client.HTTPConnection = (
        http.client.HTTPSConnection("127.0.0.1", port, context=tls, timeout=timeout)
        if tls else http.client.HTTPConnection("127.0.0.1", port, timeout=timeout))
    conn.request("GET", path)
    resp = conn.getresponse()
    assert resp.status == 200 and len(resp.read()) == len(BODY)
    conn.close()


def latency_ms(port: int, n: int, path: str = "/") -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        get(port, path)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def throughput(port: int, n: int, clients: int = 16, path: str = "/work") -> float:
    def client() -> None:
        for _ in range(n // clients):
            get(port, path)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return (n // clients) * clients / (time.perf_counter() - t)


def idle_tls_ms(port: int, client_tls: ssl.SSLContext) -> float | None:
    """One HTTPS request's latency with 10 idle TCP connections open; None
    when it gets no answer within 3 s."""
    idle = []
    for _ in range(10):
        try:  # the old server's accept queue (5) fills behind the first one
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=1))
        except OSError:
            break
    try:
        t = time.perf_counter()
        try:
            get(port, "/", client_tls, timeout=3)
        except (OSError, http.client.HTTPException):
            return None
        return (time.perf_counter() - t) * 1e3
    finally:
        for s in idle:
            s.close()


def self_signed(where: Path) -> tuple[str, str]:
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return str(cert), str(key)


def measure(rounds: int, requests: int) -> str:
    kinds = ("stdlib", "hypercorn")
    figures: dict[str, dict[str, list[float]]] = {k: {"lat": [], "work": [], "rps": [],
                                                      "tls": []} for k in kinds}
    blocked = dict.fromkeys(kinds, 0)
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = self_signed(Path(tmp))
        client_tls = ssl.create_default_context(cafile=cert)
        for _ in range(rounds):
            for kind in kinds:
                proc, port = start(kind)
                try:
                    get(port, "/")  # warm
                    f = figures[kind]
                    f["lat"].append(latency_ms(port, requests))
                    f["work"].append(latency_ms(port, requests // 4, "/work"))
                    f["rps"].append(throughput(port, requests))
                finally:
                    proc.kill()
                    proc.wait()
                proc, port = start(kind, cert, key)
                try:
                    ms = idle_tls_ms(port, client_tls)
                    if ms is None:
                        blocked[kind] += 1
                    else:
                        figures[kind]["tls"].append(ms)
                finally:
                    proc.kill()
                    proc.wait()

    def med(kind: str, name: str, fmt: str = ".2f") -> str:
        xs = figures[kind][name]
        return f"{statistics.median(xs):{fmt}}" if xs else "-"

    def ratio(name: str) -> str:
        a, b = figures["stdlib"][name], figures["hypercorn"][name]
        return f"{statistics.median(b) / statistics.median(a):.2f}" if a and b else "-"

    def tls(kind: str) -> str:
        n = blocked[kind]
        return (f"no answer in 3 s ({n} of {rounds} rounds)" if n == rounds
                else med(kind, "tls") + (f" ({n} blocked)" if n else ""))

    rows = [["GET, new connection: median ms", med("stdlib", "lat"), med("hypercorn", "lat"),
             ratio("lat")],
            ["GET of a 2 ms route: median ms", med("stdlib", "work"),
             med("hypercorn", "work"), ratio("work")],
            ["16 clients, 2 ms route: requests/s", med("stdlib", "rps", ".0f"),
             med("hypercorn", "rps", ".0f"), ratio("rps")],
            ["HTTPS GET with 10 idle connections: ms", tls("stdlib"), tls("hypercorn"), "-"]]
    return render(f"HTTP server: Hypercorn against ThreadingHTTPServer ({rounds} rounds, "
                  f"{requests} requests each)", ["figure", "stdlib", "hypercorn",
                                                 "hypercorn / stdlib"], rows)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=400)
    args = ap.parse_args()
    print(measure(args.rounds, args.requests))


if __name__ == "__main__":
    main()
