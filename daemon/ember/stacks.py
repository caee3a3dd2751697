"""Drained records -> model samples: symbolize, order root first, mark what
is missing, and attach thread labels."""

from __future__ import annotations

from collections.abc import Iterable

from . import abi
from .kernel.drain import (
    STACK_COLLISION,
    STACK_LATE,
    STACK_MISSING,
    STACK_NOT_REQUESTED,
    STACK_UNAVAILABLE,
    Record,
    Stack,
)
from .model import TRUNCATED, Frame, FrameKind, ProfileKind, Sample
from .runtimes.pycode import PythonNames, is_python
from .symbols.symbolizer import Symbolizer


def _lost(part: str, problem: str) -> Frame:
    kind = FrameKind.USER if part == "user" else FrameKind.KERNEL
    if problem == STACK_COLLISION:
        return Frame.marker(f"[lost {part} stack: collision]", kind)
    if problem == STACK_MISSING:
        return Frame.marker(f"[lost {part} stack: evicted]", kind)
    if problem == STACK_UNAVAILABLE:
        return Frame.marker(f"[no {part} stack]", kind)
    if problem == STACK_LATE:
        return Frame.marker(f"[lost {part} stack: resumed unseen]", kind)
    return Frame.marker(f"[lost {part} stack: error]", kind)


#: The leaf marker of a block that began before ember started (threads.py).
BEFORE_START = "[blocked since before the start]"


class SampleBuilder:
    """Samples of one profile kind from a program's drained records."""

    def __init__(self, symbolizer: Symbolizer, kind: ProfileKind, frequency: int = 0,
                 python: PythonNames | None = None):
        self.symbolizer = symbolizer
        self.python = python
        self.kind = kind
        self.ptype = kind.profile_type(frequency)
        self.truncated = 0
        self.cut = 0
        self.lost_user = 0
        self.lost_kernel = 0

    def frames(self, part: str, stack: Stack, pid: int, kernel_thread: bool) -> list[Frame]:
        """Frames of one stack ("user" or "kernel"), root first, as samples
        have them (ember dump shows stacks so)."""
        return self._part(part, stack, pid, kernel_thread)

    def _part(self, part: str, stack: Stack, pid: int, kernel_thread: bool) -> list[Frame]:
        """Frames of one stack, root first."""
        if stack.problem == STACK_NOT_REQUESTED:
            return []
        if stack.problem is not None:
            if stack.problem == STACK_UNAVAILABLE and (part == "kernel" or kernel_thread):
                # No stack of that kind to take: a sample in user mode has no
                # kernel frames, a kernel thread has no user stack.
                return []
            if part == "user":
                self.lost_user += 1
            else:
                self.lost_kernel += 1
            return [_lost(part, stack.problem)]
        frames = (self._user_frames(pid, stack.ips) if part == "user"
                  else self.symbolizer.kernel_frames(stack.ips))
        frames.reverse()
        kind = FrameKind.USER if part == "user" else FrameKind.KERNEL
        if stack.truncated:
            self.truncated += 1
            frames.insert(0, Frame.marker(TRUNCATED, kind))
        elif stack.cut is not None:
            # the table walk stopped short of the root, and says why
            self.cut += 1
            frames.insert(0, Frame.marker(f"[unwind stopped: {stack.cut}]", kind))
        return frames

    def _user_frames(self, pid: int, ips: tuple[int, ...]) -> list[Frame]:
        """Leaf first. Python slot pairs (bpf/ember.h, EMBER_PY_CODE) become
        Python frames, in place of the interpreter-loop frame just before
        them; the native runs between them are symbolized as usual."""
        if self.python is None or not any(is_python(ip) for ip in ips):
            return self.symbolizer.user_frames(pid, ips)
        proc = self.symbolizer.processes.get(pid)
        memo = self.python.stacks
        hit = memo.get((pid, ips))
        if hit is not None and hit[0] is proc:  # built from these maps
            return list(hit[1])
        out = self._mixed_frames(pid, ips)
        if all(f.mapping is not None and not f.name.startswith("[") for f in out):
            memo.put((pid, ips), (proc, tuple(out)))  # not with a frame to try again
        return out

    def _mixed_frames(self, pid: int, ips: tuple[int, ...]) -> list[Frame]:
        assert self.python is not None
        interp = self.python.interpreters.get(pid)
        out: list[Frame] = []
        run: list[int] = []
        leaf = True
        i = 0
        while i < len(ips):
            ip = ips[i]
            if not is_python(ip):
                run.append(ip)
                i += 1
                continue
            if run and interp is not None and interp.in_eval(run[-1] - (0 if leaf and
                                                                         len(run) == 1 else 1)):
                run.pop()  # the interpreter loop's frame: its Python frames replace it
            if run:
                out += self.symbolizer.user_frames(pid, run, leaf=leaf)
                leaf = False
                run = []
            frame = self.python.frame(pid, ip, ips[i + 1] if i + 1 < len(ips) else 0)
            if frame is not None:
                out.append(frame)
            leaf = False
            i += 2
        if run:
            out += self.symbolizer.user_frames(pid, run, leaf=leaf)
        return out

    def _stack(self, r_user: Stack, r_kernel: Stack, pid: int) -> list[Frame]:
        proc = self.symbolizer.processes.get(pid)
        kthread = proc.kernel_thread if proc else (r_user.problem == STACK_UNAVAILABLE
                                                   and r_kernel.problem is None)
        return (self._part("user", r_user, pid, kthread)
                + self._part("kernel", r_kernel, pid, kthread))

    def build(self, records: Iterable[Record]) -> list[Sample]:
        kind = self.kind.counts_kind
        records = [r for r in records if r.kind == kind]
        procs = self.symbolizer.processes
        procs.touch({r.pid for r in records} | {r.peer_pid for r in records if r.peer_pid})
        # a drain's new processes named in one batch each (the warm path skips it)
        self.symbolizer.prepare((r.pid, [ip for ip in r.user.ips if not is_python(ip)])
                                for r in records if r.user.problem is None)
        samples = []
        for r in records:
            frames = self._stack(r.user, r.kernel, r.pid)
            labels: tuple[tuple[str, str], ...] = ()
            if self.kind.clock:
                values = (r.count, r.count * self.ptype.period)
            else:
                values = (r.count, r.total_ns)
            if kind == abi.KIND_BLOCKED:
                state = abi.state_name(r.state)
                frames.append(Frame.marker(f"[{state}]"))
                labels = (("thread_state", state),)
                if r.state & abi.STATE_BEFORE_START:
                    frames.append(Frame.marker(BEFORE_START))
            elif kind == abi.KIND_RUNQ:
                frames.append(Frame.marker("[runqueue]"))
                labels = (("thread_state", "runnable"),)
            elif kind == abi.KIND_WAKEUP:
                # the waker's stack; the leaf names whom it woke
                frames.append(Frame.marker(f"[wakes {r.peer_comm}]"))
                labels = (("wakee_pid", str(r.peer_pid)), ("wakee_comm", r.peer_comm))
            elif kind == abi.KIND_OFFWAKE:
                # as bcc's offwaketime folds it: the blocked stack root first,
                # "--", then the waker's stack leaf first, then the waker
                waker = self._stack(r.peer_user, r.peer_kernel, r.peer_pid)
                waker.reverse()
                frames += [Frame.marker("--"), *waker, Frame.marker(r.peer_comm)]
                labels = (("waker_pid", str(r.peer_pid)), ("waker_comm", r.peer_comm))
            if r.in_flight:
                labels += (("in_flight", "true"),)
            samples.append(Sample(tuple(frames), values, r.pid, r.tid, r.comm, labels))
        procs.expire()
        return samples
