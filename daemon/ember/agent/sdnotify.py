"""systemd's readiness protocol (sd_notify(3)) without libsystemd: one
datagram to $NOTIFY_SOCKET. A no-op when not started by systemd."""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send e.g. "READY=1"; returns whether a notify socket was there."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):  # abstract namespace
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.sendto(state.encode(), path)
        except OSError:
            return False
    return True
