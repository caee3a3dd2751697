"""Loopback helpers for tests that start servers."""

from __future__ import annotations

import socket
from collections.abc import Callable

from tests.support.waits import wait_for


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ask_and_leave(port: int, path: str, until: Callable[[], object],
                  timeout: float = 5) -> bool:
    """GET ``path`` from 127.0.0.1:port, then hang up as soon as until()
    holds (or after ``timeout`` seconds); whether it held."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        return wait_for(until, timeout, every=0.01)
