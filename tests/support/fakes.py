"""An in-memory stand-in for one loaded BPF program's maps, with the same
semantics as bpf/oncpu.c and bpf/offcpu.c (atomic events), for the drainer's
unit tests."""

from __future__ import annotations

import ctypes as ct
from collections.abc import Callable, Sequence

from ember import abi
from ember.kernel.drain import Stack


class FakeProgram:
    def __init__(self, generations: int):
        self.generations = generations
        self.epoch = 0
        self.counts_: dict[bytes, tuple[abi.Key, abi.Value]] = {}
        self.slots: list[dict[int, tuple[int, ...]]] = [{} for _ in range(generations)]
        self.starts_: dict[int, abi.Start] = {}
        self.counted = 0
        self.counted_ns = 0
        self.clock = 0
        # Events that happen while a drain runs: just before it flips the
        # epoch, and just after (before it reads the counts).
        self.before_flip: list[Callable[[], None]] = []
        self.after_flip: list[Callable[[], None]] = []
        # ... and just after it has read ember_starts
        self.after_starts: list[Callable[[], None]] = []
        self.flipped = False
        self.bounds: dict[int, int] = {}
        self.crossed_: dict[int, abi.Crossed] = {}

    # --- what the BPF programs do ---
    def _stackid(self, epoch: int, ips: tuple[int, ...]) -> int:
        slot = self.slots[epoch % self.generations]
        for sid, existing in slot.items():
            if existing == ips:
                return sid
        # Small ids, reused once a slot is cleared: the same id names other
        # stacks in later epochs, as hash-bucket ids do in the kernel.
        sid = len(slot)
        slot[sid] = ips
        return sid

    def _count(self, key: abi.Key, ns: int) -> None:
        raw = bytes(key)
        if raw in self.counts_:
            _, v = self.counts_[raw]
            v.count += 1
            v.total_ns += ns
        else:
            self.counts_[raw] = (key, abi.Value(count=1, total_ns=ns))
        self.counted += 1
        self.counted_ns += ns

    def sample(self, pid: int, tid: int, user: tuple[int, ...], kernel: tuple[int, ...]) -> None:
        key = abi.Key(pid=pid, tid=tid, epoch=self.epoch, stack_epoch=self.epoch,
                      comm=b"t%d" % tid)
        key.user_stack_id = self._stackid(self.epoch, user)
        key.kernel_stack_id = self._stackid(self.epoch, kernel)
        self._count(key, 0)

    def switch_out(self, pid: int, tid: int, user: tuple[int, ...], kernel: tuple[int, ...],
                   state: int = abi.STATE_INTERRUPTIBLE) -> None:
        s = abi.Start(ts=self.clock, pid=pid, stack_epoch=self.epoch, state=state,
                      comm=b"t%d" % tid)
        s.user_stack_id = self._stackid(self.epoch, user)
        s.kernel_stack_id = self._stackid(self.epoch, kernel)
        self.starts_[tid] = s

    def switch_in(self, tid: int) -> None:
        s = self.starts_.pop(tid, None)
        if s is None:
            return
        since = s.ts
        bound = self.bounds.get(self.epoch % abi.BOUNDS, 0)
        if s.ts < bound:  # as offcpu.c: the drain charges what came before
            self.crossed_[tid] = abi.Crossed(start=s, end_ts=self.clock, epoch=self.epoch)
            since = bound
        key = abi.Key(pid=s.pid, tid=tid, user_stack_id=s.user_stack_id,
                      kernel_stack_id=s.kernel_stack_id, epoch=self.epoch,
                      stack_epoch=s.stack_epoch, state=s.state, comm=s.comm,
                      kind=abi.KIND_BLOCKED)
        self._count(key, self.clock - since)

    # --- drain.DrainMaps ---
    charges_in_flight = True

    def write_bound(self, epoch: int, ns: int) -> None:
        self.bounds[epoch % abi.BOUNDS] = ns

    def crossed(self) -> Sequence[tuple[int, abi.Crossed]]:
        return [(tid, abi.Crossed.from_buffer_copy(c)) for tid, c in self.crossed_.items()]

    def in_flight(self) -> Sequence[abi.InFlight]:
        return []

    def delete_crossed(self, tids: Sequence[int]) -> None:
        for tid in tids:
            del self.crossed_[tid]

    def write_epoch(self, epoch: int) -> None:
        for event in self.before_flip:
            event()
        self.epoch = epoch
        for event in self.after_flip:
            event()
        self.before_flip.clear()
        self.after_flip.clear()
        self.flipped = True

    def counts(self) -> Sequence[tuple[abi.Key, abi.Value]]:
        return [(abi.Key.from_buffer_copy(k), abi.Value.from_buffer_copy(v))
                for k, v in self.counts_.values()]

    def delete_counts(self, keys: Sequence[abi.Key]) -> None:
        for k in keys:
            del self.counts_[bytes(k)]

    def starts(self) -> Sequence[tuple[int, abi.Start]]:
        out = [(tid, abi.Start.from_buffer_copy(s)) for tid, s in self.starts_.items()]
        if self.flipped:  # the read after the flip
            self.flipped = False
            for event in self.after_starts:
                event()
            self.after_starts.clear()
        return out

    def wakes(self) -> Sequence[tuple[int, abi.Wake]]:
        return []

    def stack(self, slot: int, stack_id: int) -> Stack | None:
        ips = self.slots[slot].get(stack_id)
        return None if ips is None else Stack(ips)

    def clear_stacks(self, slot: int) -> None:
        self.slots[slot].clear()


class NoGrace:
    exact = True

    def wait(self) -> None:
        pass


def key_bytes(key: abi.Key) -> bytes:
    return bytes(ct.string_at(ct.addressof(key), ct.sizeof(key)))
