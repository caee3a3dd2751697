"""Draining the kernel's aggregates without losing or double-counting a sample.

The BPF programs add to ``ember_counts`` under the current *epoch* (a field of
every key) and store stacks in stack map ``stack_epoch % G``. One drain of
epoch ``e``:

0. snapshot the pending off-CPU starts: each holds stack ids of the slot that
   this drain clears; resolve those stacks now and *carry* them in memory, so
   a thread blocked for minutes still gets its stack when it wakes;
1. write epoch ``e + 1`` into ``ember_config``: new events go to the new epoch;
2. wait for an RCU grace period (``membarrier(MEMBARRIER_CMD_GLOBAL)`` runs
   ``synchronize_rcu()``). BPF programs run inside RCU read-side sections, so
   afterwards no program still writes epoch ``e``;
3. read every count of epoch ``<= e`` (batch lookup) and resolve its stacks;
4. delete exactly those keys, never the new epoch's;
5. clear stack slot ``(e - (G - 2)) % G``; it becomes active again only after
   the next flip(s).

The exact off-CPU program (offcpu.c) also charges time to the interval it
passes in. Before step 1 the drain writes its time ``T`` as the boundary of
epoch ``e + 1`` (``ember_bounds``); after step 2 every program run counts
blocked and run-queue time from ``T`` on only. The part before ``T`` of each
block in flight is charged here, from what the drain last charged it to (or
the previous boundary) up to ``T``: the blocks still in ``ember_starts``, and
the blocks that ended between the flip and that read, which the program put
into ``ember_crossed``. A block seen in both is charged once: what each
(thread, start) was charged up to is remembered until it ends.

On-CPU samples take their stacks and count in the same epoch: two stack maps
suffice (G = 2). An off-CPU block takes its stacks at switch-out and counts at
switch-in, possibly an epoch later, so its counts may name the previous epoch's
stacks: three stack maps (G = 3), the previous one cleared one drain later.

Nothing here touches bcc: ``DrainMaps`` is the seam. The real implementation is
in ``program.py``; tests drive this module with an in-memory fake.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from .. import abi

log = logging.getLogger(__name__)

#: Why a stack is absent, as shown in frames and counted in metrics.
STACK_COLLISION = "collision"       # the stack map bucket held another stack
STACK_MISSING = "missing"           # the id was not in the stack map any more
STACK_ERROR = "error"               # bpf_get_stackid failed otherwise
STACK_UNAVAILABLE = "unavailable"   # -EFAULT: no stack of this kind (kernel thread)
STACK_NOT_REQUESTED = "not-requested"
STACK_LATE = "late"                 # sampled off-CPU: back in user space unseen


#: Why a walk from unwind tables stopped short of the root (Stack.cut).
CUT_REASONS: dict[int, str] = {
    abi.UnwindEnd.TRUNCATED: "truncated",
    abi.UnwindEnd.UNSUPPORTED: "unsupported rule",
    abi.UnwindEnd.READ_FAILED: "read failed",
    abi.UnwindEnd.NO_MAPPING: "no mapping",
    abi.UnwindEnd.BAD_FRAME: "bad frame",
}


@dataclass(frozen=True)
class Stack:
    """Instruction pointers leaf first, as the kernel walked them, or why not;
    ``cut`` says why a walk that gave frames stopped before the root, when
    the unwinder knows (the table unwinder does; frame pointers do not)."""

    ips: tuple[int, ...] = ()
    problem: str | None = None
    cut: str | None = None

    @property
    def truncated(self) -> bool:
        return self.cut == "truncated" or len(self.ips) >= abi.MAX_STACK_DEPTH


@dataclass(frozen=True)
class Record:
    """One drained counts entry with its stacks resolved to addresses."""

    pid: int
    tid: int
    comm: str
    state: int
    user: Stack
    kernel: Stack
    count: int
    total_ns: int
    in_flight: bool = False  # part of an off-CPU block still going on at the drain
    kind: int = abi.KIND_ONCPU
    # the other thread of a wakeup (waker for off-wake, wakee for wakeup)
    peer_pid: int = 0
    peer_tid: int = 0
    peer_comm: str = ""
    peer_user: Stack = Stack(problem=STACK_NOT_REQUESTED)
    peer_kernel: Stack = Stack(problem=STACK_NOT_REQUESTED)


@dataclass
class DrainStats:
    records: int = 0
    events: int = 0
    total_ns: int = 0
    stacks_missing: int = 0
    stacks_truncated: int = 0
    stacks_carried: int = 0
    pending: int = 0          # off-CPU blocks in progress at the snapshot
    in_flight_ns: int = 0     # time of blocks in flight charged by this drain
    blocked_threads: int = 0  # threads blocked (not runnable) at the drain
    longest_block_ns: int = 0  # ... the longest of those blocks so far
    duration_s: float = 0.0

    def add(self, other: DrainStats) -> None:
        """Sum what several drains read (the in-progress figures are not sums)."""
        self.records += other.records
        self.events += other.events
        self.total_ns += other.total_ns
        self.stacks_missing += other.stacks_missing
        self.stacks_truncated += other.stacks_truncated
        self.in_flight_ns += other.in_flight_ns


@dataclass
class DrainResult:
    records: list[Record] = field(default_factory=list)
    stats: DrainStats = field(default_factory=DrainStats)


class DrainMaps(Protocol):
    """What the drainer needs from one loaded BPF program's maps."""

    generations: int

    @property
    def charges_in_flight(self) -> bool:
        """Does the program count only from the drain boundary (offcpu.c)?"""

    def write_bound(self, epoch: int, ns: int) -> None: ...
    def crossed(self) -> Sequence[tuple[int, abi.Crossed]]: ...
    def in_flight(self) -> Sequence[abi.InFlight]: ...
    def delete_crossed(self, tids: Sequence[int]) -> None: ...
    def write_epoch(self, epoch: int) -> None: ...
    def counts(self) -> Sequence[tuple[abi.Key, abi.Value]]: ...
    def delete_counts(self, keys: Sequence[abi.Key]) -> None: ...
    def starts(self) -> Sequence[tuple[int, abi.Start]]: ...
    def wakes(self) -> Sequence[tuple[int, abi.Wake]]: ...
    def stack(self, slot: int, stack_id: int) -> Stack | None: ...
    def clear_stacks(self, slot: int) -> None: ...


# --- RCU grace period ---------------------------------------------------------

_MEMBARRIER_CMD_QUERY = 0
_MEMBARRIER_CMD_GLOBAL = 1
_SYS_MEMBARRIER = 324  # x86_64


class GracePeriod:
    """Waits until every BPF program that started before the call has ended."""

    def __init__(self, fallback_s: float = 0.05) -> None:
        self.fallback_s = fallback_s
        self._syscall = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).syscall
        mask = self._syscall(_SYS_MEMBARRIER, _MEMBARRIER_CMD_QUERY, 0, 0)
        self.exact = mask >= 0 and bool(mask & _MEMBARRIER_CMD_GLOBAL)
        if not self.exact:
            log.warning("membarrier(GLOBAL) unavailable (nohz_full?): waiting %.0f ms "
                        "after each epoch flip instead", fallback_s * 1000)

    def wait(self) -> None:
        if self.exact:
            rc = self._syscall(_SYS_MEMBARRIER, _MEMBARRIER_CMD_GLOBAL, 0, 0)
            if rc == 0:
                return
            log.warning("membarrier failed: %s", os.strerror(ctypes.get_errno() or errno.EINVAL))
        time.sleep(self.fallback_s)


# --- the drainer --------------------------------------------------------------


def _comm(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


class Flip(NamedTuple):
    """A drain between its flip and its collecting: the epoch flipped, the
    boundary (monotonic ns; None: a final drain without one), and what was
    read before the flip."""

    epoch: int
    final: bool
    bound: int | None
    before: Sequence[tuple[int, abi.Start]]
    wakes: Sequence[tuple[int, abi.Wake]]
    seconds: float   # what the flip took


class Drainer:
    def __init__(self, maps: DrainMaps, grace: GracePeriod | None = None, epoch: int = 0,
                 clock: Callable[[], int] = time.monotonic_ns,
                 walk_user: Callable[[int, int, int, int, int], Stack] | None = None):
        if maps.generations not in (2, 3):
            raise ValueError("stack generations must be 2 or 3")
        self.maps = maps
        self.grace = grace or GracePeriod()
        self.epoch = epoch
        self.clock = clock  # CLOCK_MONOTONIC: bpf_ktime_get_ns's clock
        # (pid, ip, sp, bp, tid) -> the user stack of a thread that is not running
        # (unwind/remote.py): sampled blocks in flight have none of their own
        self.walk_user = walk_user
        # user stacks walked for blocks in flight, by (pid, ip, sp, bp, tid): a
        # thread still blocked in the same place has the same stack
        self._walked: dict[tuple[int, int, int, int, int], Stack] = {}
        self._walked_now: dict[tuple[int, int, int, int, int], Stack] = {}
        self.carried: dict[tuple[int, int], Stack | None] = {}
        self.bound = 0  # the boundary in effect: blocks are charged from here
        # (tid, start ts) of blocks in flight -> what they were charged up to
        self.charged: dict[tuple[int, int], int] = {}

    def begin(self, now_ns: int) -> None:
        """Before the programs attach: time is charged from now_ns on."""
        self.bound = now_ns
        if self.maps.charges_in_flight:
            self.maps.write_bound(self.epoch, now_ns)

    @property
    def _keep(self) -> int:
        """How many epochs back stack slots stay intact after a drain."""
        return self.maps.generations - 2

    def drain(self, final: bool = False, now_ns: int | None = None,
              min_ns: int = 0, max_ns: int = 0) -> DrainResult:
        """Drain the current epoch, and charge the off-CPU blocks in flight up
        to now (the program charges the rest when they end). With ``final``
        (programs detached), blocks still in progress are charged up to
        ``now_ns`` and kept when ``min_ns <= duration <= max_ns`` (``max_ns``
        0: no limit). ``flip`` then ``collect``."""
        return self.collect(self.flip(final, now_ns), min_ns, max_ns)

    def flip(self, final: bool = False, now_ns: int | None = None) -> Flip:
        """Steps 0-2: the boundary written and the epoch flipped (nothing
        written to the epoch drained once this returns). A caller draining
        several programs flips them all before collecting any, so that their
        boundaries are the same moment, not one apart by another's
        collecting (its symbolizing, on a loaded machine, took long enough
        to put an interval's off-CPU time 4% past its length)."""
        t0 = time.monotonic()
        e = self.epoch
        # 0. carry the stacks of blocks that outlive the slot cleared below
        # (read before the flip: a block may end between the flip and the
        # read of the blocks in flight below, and count in the next epoch).
        before = self.maps.starts()
        wakes = self.maps.wakes()

        # 1-2. the boundary, the flip, then wait until nothing writes epoch e.
        bound = now_ns
        if not final:
            bound = self.clock()
            if self.maps.charges_in_flight:
                self.maps.write_bound(e + 1, bound)
            self.maps.write_epoch(e + 1)
            self.grace.wait()
        elif self.maps.charges_in_flight and bound is not None:
            self.maps.write_bound(e, bound)  # the programs are gone: the last one
        return Flip(e, final, bound, before, wakes, time.monotonic() - t0)

    def collect(self, flip: Flip, min_ns: int = 0, max_ns: int = 0) -> DrainResult:
        """Steps 3-5 of a ``flip``: the epoch read, the blocks in flight
        charged up to its boundary, what was read forgotten."""
        t0 = time.monotonic()
        e, final, bound, before, wakes, flip_s = flip
        result = DrainResult()
        cache: dict[tuple[int, int], Stack | None] = {}

        def from_map(se: int, sid: int) -> Stack | None:
            k = (se, sid)
            if k not in cache:
                cache[k] = self.maps.stack(se % self.maps.generations, sid)
            return cache[k]

        # epochs whose stack slots are intact now (e + 1: the iterator's, just begun)
        in_map = range(e - self._keep, e + 2)
        tracked = self.maps.charges_in_flight
        refs: list[tuple[int, int, int]] = [
            (s.stack_epoch, s.user_stack_id, s.kernel_stack_id) for _, s in before]
        refs += [(w.stack_epoch, w.user_stack_id, w.kernel_stack_id) for _, w in wakes]

        # the blocks in flight now, and those that ended since the flip
        pending = self.maps.starts() if tracked and not final else before
        crossed = self.maps.crossed() if tracked else []
        # the sampled program's: claimed up to the boundary by its iterator
        sampled = self.maps.in_flight() if tracked and bound is not None else []
        if tracked and not final:
            wakes = self.maps.wakes()
        refs += [(s.stack_epoch, s.user_stack_id, s.kernel_stack_id) for _, s in pending]
        refs += [(c.start.stack_epoch, c.start.user_stack_id, c.start.kernel_stack_id)
                 for _, c in crossed]
        refs += [(w.stack_epoch, w.user_stack_id, w.kernel_stack_id) for _, w in wakes]
        new_carried: dict[tuple[int, int], Stack | None] = {}
        for stack_epoch, user_id, kernel_id in refs:
            if stack_epoch > e - self._keep:
                continue
            for sid in (user_id, kernel_id):
                ref = (stack_epoch, sid)
                if sid < 0 or ref in new_carried:
                    continue
                new_carried[ref] = (from_map(*ref) if stack_epoch in in_map
                                    else self.carried.get(ref))
        lookup_carried = {**self.carried, **new_carried}

        def resolve(se: int, sid: int) -> Stack:
            if sid == abi.STACK_NONE:
                return Stack(problem=STACK_NOT_REQUESTED)
            if sid == abi.STACK_LATE:
                return Stack(problem=STACK_LATE)
            if sid == abi.STACK_STALE:
                result.stats.stacks_missing += 1
                return Stack(problem=STACK_MISSING)
            if sid == -errno.EEXIST:
                return Stack(problem=STACK_COLLISION)
            if sid == -errno.EFAULT:
                return Stack(problem=STACK_UNAVAILABLE)
            if sid < 0:
                return Stack(problem=STACK_ERROR)
            stack = from_map(se, sid) if se in in_map else lookup_carried.get((se, sid))
            if stack is None:
                result.stats.stacks_missing += 1
                return Stack(problem=STACK_MISSING)
            if stack.truncated:
                result.stats.stacks_truncated += 1
            return stack

        # 3. read this epoch's counts (all of them once the programs are gone).
        drained: list[abi.Key] = []
        no_peer = Stack(problem=STACK_NOT_REQUESTED)
        for key, value in self.maps.counts():
            if key.epoch > e and not final:
                continue
            drained.append(key)
            peered = key.kind in (abi.KIND_WAKEUP, abi.KIND_OFFWAKE)
            result.records.append(Record(
                pid=key.pid, tid=key.tid, comm=_comm(key.comm), state=key.state,
                user=resolve(key.stack_epoch, key.user_stack_id),
                kernel=resolve(key.stack_epoch, key.kernel_stack_id),
                count=value.count, total_ns=value.total_ns, kind=key.kind,
                peer_pid=key.peer_pid, peer_tid=key.peer_tid, peer_comm=_comm(key.peer_comm),
                peer_user=(resolve(key.peer_stack_epoch, key.peer_user_stack_id) if peered
                           else no_peer),
                peer_kernel=(resolve(key.peer_stack_epoch, key.peer_kernel_stack_id) if peered
                             else no_peer),
            ))
            result.stats.events += value.count
            result.stats.total_ns += value.total_ns

        # 3b. blocks in flight: what passed of them up to the boundary.
        if bound is not None and (tracked or final):
            woke = {tid: w.ts for tid, w in wakes}
            for tid, st in pending:
                if st.state != abi.STATE_RUNNABLE and tid not in woke:
                    result.stats.blocked_threads += 1
                    result.stats.longest_block_ns = max(result.stats.longest_block_ns,
                                                        bound - st.ts)
                if st.ts < bound:
                    if final and bound - st.ts < min_ns:
                        continue  # as the program ignores blocks this short
                    self._charge(result, tid, st, woke.get(tid, 0), bound, final, resolve,
                                 max_ns)
            if not final:
                for tid, c in crossed:
                    if c.epoch == e + 1:  # ended after this flip, before the read above
                        self._charge(result, tid, c.start, c.wake_ts, bound, final, resolve,
                                     max_ns)
            for f in sampled:
                self._charge_sampled(result, f, final, resolve)
            self._walked, self._walked_now = self._walked_now, {}
            self.charged = {k: v for k, v in self.charged.items() if v == bound}
            self.bound = bound
        if crossed:
            self.maps.delete_crossed([tid for tid, _ in crossed])

        # 4-5. forget what was read; recycle the oldest stack slot.
        self.maps.delete_counts(drained)
        self.maps.clear_stacks((e - self._keep) % self.maps.generations)
        self.carried = new_carried
        self.epoch = e + 1
        result.stats.records = len(result.records)
        result.stats.stacks_carried = len(new_carried)
        result.stats.pending = len(pending)
        result.stats.duration_s = flip_s + time.monotonic() - t0
        return result

    def _charge_sampled(self, result: DrainResult, f: abi.InFlight, final: bool,
                        resolve: Callable[[int, int], Stack]) -> None:
        """A sampled block in flight, claimed by the program's iterator."""
        if f.to_ns <= f.from_ns:
            return
        if not f.ip:
            user = Stack(problem=STACK_NOT_REQUESTED)
        elif self.walk_user is None:
            user = Stack(problem=STACK_UNAVAILABLE)
        else:
            key = (f.pid, f.ip, f.sp, f.bp, f.tid)
            walked = self._walked.get(key) or self._walked_now.get(key)
            if walked is None:
                walked = self.walk_user(*key)
            user = self._walked_now[key] = walked
        result.records.append(Record(
            pid=f.pid, tid=f.tid, comm=_comm(f.comm), state=f.state, user=user,
            kernel=resolve(f.stack_epoch, f.kernel_stack_id),
            count=1 if final else 0, total_ns=f.to_ns - f.from_ns, in_flight=True,
            kind=abi.KIND_BLOCKED))
        result.stats.in_flight_ns += f.to_ns - f.from_ns
        if f.state != abi.STATE_RUNNABLE:
            result.stats.blocked_threads += 1
            result.stats.longest_block_ns = max(result.stats.longest_block_ns,
                                                f.to_ns - f.since_ns)

    def _charge(self, result: DrainResult, tid: int, st: abi.Start, wake_ts: int, upto: int,
                final: bool, resolve: Callable[[int, int], Stack], max_ns: int) -> None:
        """Charge a block's time from where it was last charged up to ``upto``:
        blocked until its wakeup, waiting for a CPU after it. A block in
        flight at the final drain counts as one block; earlier, its blocks are
        counted by the program when it ends."""
        key = (tid, st.ts)
        since = max(st.ts, self.charged.get(key, self.bound))
        if upto <= since or (max_ns and upto - st.ts > max_ns):
            return
        self.charged[key] = upto
        if st.state == abi.STATE_RUNNABLE:
            parts = [(abi.KIND_RUNQ, since, upto)]
        else:
            woken = wake_ts if st.ts <= wake_ts <= upto else upto
            parts = [(abi.KIND_BLOCKED, since, min(woken, upto)),
                     (abi.KIND_RUNQ, max(since, woken), upto)]
        for kind, a, b in parts:
            if b <= a:
                continue
            result.records.append(Record(
                pid=st.pid, tid=tid, comm=_comm(st.comm),
                state=abi.STATE_RUNNABLE if kind == abi.KIND_RUNQ else st.state,
                user=resolve(st.stack_epoch, st.user_stack_id),
                kernel=resolve(st.stack_epoch, st.kernel_stack_id),
                count=1 if final else 0, total_ns=b - a, in_flight=True, kind=kind))
            result.stats.in_flight_ns += b - a
