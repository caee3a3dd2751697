"""Census.put_blocked's bookkeeping (no kernel: the census, /proc and the
programs are faked; tests/bpf/test_threads.py loads the real ones)."""

from __future__ import annotations

from typing import Any

from ember import abi
from ember.kernel.census import ThreadNow
from ember.kernel.drain import Stack
from ember.threads import Census

START_NS = 5_000


class Programs:
    """What put_blocked touches of a program."""

    def __init__(self) -> None:
        self.census_stacks: dict[int, Stack] = {}
        self.blocks: dict[int, abi.Start] = {}

    def put_block(self, tid: int, start: abi.Start) -> bool:
        self.blocks[tid] = start
        return True

    def take_back_block(self, tid: int, start_ts: int) -> None:
        if tid in self.blocks and self.blocks[tid].ts == start_ts:
            del self.blocks[tid]


def thread(tid: int) -> ThreadNow:
    return ThreadNow(pid=100, tid=tid, comm="w", state=abi.STATE_INTERRUPTIBLE,
                     on_cpu=False, kernel_thread=False, since_ns=1_000, now_ns=4_000,
                     ip=1, sp=2, bp=3, kernel=Stack(ips=(0xffffffff81000000 + tid,)),
                     exec_start=7)


def census(threads: list[ThreadNow], woke: dict[int, list[bool]]) -> Census:
    """A census seeing these threads; woke[tid]: _woke's answers in turn."""
    c: Any = object.__new__(Census)
    c._next_id = 0
    c.start_ns = 0
    c.take = lambda: threads
    c._runs = lambda t: 1
    c.user_stack = lambda t: Stack(ips=(0x400000 + t.tid,))
    c._woke = lambda t, runs: woke[t.tid].pop(0)
    return c


def test_a_thread_woken_before_its_put_gets_no_block_and_leaves_no_stacks() -> None:
    p = Programs()
    c = census([thread(1), thread(2)], {1: [True], 2: [False, False]})
    assert c.put_blocked([p], START_NS, 0, user=True, kernel=True) == 1
    assert set(p.blocks) == {2}
    start = p.blocks[2]
    assert start.ts == START_NS and start.state & abi.STATE_BEFORE_START
    # the kept block's stacks, and no other
    assert set(p.census_stacks) == {start.user_stack_id, start.kernel_stack_id}
    assert p.census_stacks[start.user_stack_id].ips == (0x400002,)


def test_a_thread_woken_right_after_its_put_is_taken_back() -> None:
    p = Programs()
    c = census([thread(1)], {1: [False, True]})
    assert c.put_blocked([p], START_NS, 0, user=True, kernel=True) == 0
    assert p.blocks == {}
