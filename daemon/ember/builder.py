"""Drained records -> model samples: symbolize, order root first, mark what
is missing, and attach thread labels."""

from __future__ import annotations

from collections.abc import Iterable

from . import abi
from .drain import (
    STACK_COLLISION,
    STACK_MISSING,
    STACK_NOT_REQUESTED,
    STACK_UNAVAILABLE,
    Record,
    Stack,
)
from .model import Frame, FrameKind, ProfileType, Sample
from .symbolize import Symbolizer


def _lost(part: str, problem: str) -> Frame:
    kind = FrameKind.USER if part == "user" else FrameKind.KERNEL
    if problem == STACK_COLLISION:
        return Frame.marker(f"[lost {part} stack: collision]", kind)
    if problem == STACK_MISSING:
        return Frame.marker(f"[lost {part} stack: evicted]", kind)
    if problem == STACK_UNAVAILABLE:
        return Frame.marker(f"[no {part} stack]", kind)
    return Frame.marker(f"[lost {part} stack: error]", kind)


class SampleBuilder:
    def __init__(self, symbolizer: Symbolizer, ptype: ProfileType):
        self.symbolizer = symbolizer
        self.ptype = ptype
        self.truncated = 0
        self.lost_user = 0
        self.lost_kernel = 0

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
        frames = (self.symbolizer.user_frames(pid, stack.ips) if part == "user"
                  else self.symbolizer.kernel_frames(stack.ips))
        frames.reverse()
        if stack.truncated:
            self.truncated += 1
            kind = FrameKind.USER if part == "user" else FrameKind.KERNEL
            frames.insert(0, Frame.marker("[truncated]", kind))
        return frames

    def build(self, records: Iterable[Record]) -> list[Sample]:
        records = list(records)
        procs = self.symbolizer.processes
        procs.refresh(r.pid for r in records)
        samples = []
        offcpu = self.ptype.name == "offcpu"
        for r in records:
            proc = procs.get(r.pid)
            kthread = proc.kernel_thread if proc else (r.user.problem == STACK_UNAVAILABLE
                                                       and r.kernel.problem is None)
            frames = self._part("user", r.user, r.pid, kthread)
            frames += self._part("kernel", r.kernel, r.pid, kthread)
            labels: tuple[tuple[str, str], ...] = ()
            if offcpu:
                state = abi.state_name(r.state)
                frames.append(Frame.marker(f"[{state}]"))
                labels = (("thread_state", state),)
                if r.in_flight:
                    labels += (("in_flight", "true"),)
                values = (r.count, r.total_ns)
            else:
                values = (r.count, r.count * self.ptype.period)
            samples.append(Sample(tuple(frames), values, r.pid, r.tid, r.comm, labels))
        procs.expire()
        return samples
