"""A guard against inputs that make a parser hang, for the fuzz tests.

It is not a speed test: a 400-byte input that takes a parser 10 s of CPU
is exponential, not slow. The block's CPU time is measured with the
cyclic garbage collector off, since a full collection of the test run's
heap lands on whichever example allocates at that moment and once took
2.3 s of one example's CPU on a loaded CI machine."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager

HANG_S = 10.0  # CPU seconds


@contextmanager
def no_hang(what: object = "", limit: float = HANG_S) -> Iterator[None]:
    """Fails if the block took `limit` CPU seconds of this thread or more;
    `what` goes in the message (the input, shortened by the caller)."""
    was_on = gc.isenabled()
    gc.disable()
    start = time.thread_time()
    try:
        yield
    finally:
        elapsed = time.thread_time() - start
        if was_on:
            gc.enable()
    assert elapsed < limit, f"{elapsed:.1f} s of CPU: {what!r}"
