"""Waiting for a condition in tests that run real threads and processes."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(cond: Callable[[], object], timeout: float = 20, every: float = 0.05) -> bool:
    """True as soon as cond() is true, False once timeout seconds passed."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(every)
    return False
