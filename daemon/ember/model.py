"""The profile model every encoder reads: frozen, hashable, bcc-free.

Frames are ordered root first. A function inlined into another is a frame of
its own (``inlined=True``) right after (leafwards of) the frame it was inlined
into, at the same address; the pprof encoder folds such runs back into one
Location with several Line entries. A frame that could not be symbolized still
names what is known (``libfoo.so+0x1a2b``, ``[unknown]``); a stack that could
not be captured is a synthetic frame (``[lost user stack: collision]``), so no
sample ever disappears from a profile.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from collections.abc import Mapping as MappingABC
from dataclasses import dataclass, field
from typing import TypeVar

from . import abi

_T = TypeVar("_T")

#: The deepest stack an encoder, a view or the collector keeps. A deeper one
#: (a runaway recursion, a hostile profile) keeps its leafmost frames under a
#: root ``[truncated]`` frame, as the BPF walkers' truncated stacks do: the
#: leaf is where the time is.
MAX_STACK_DEPTH = 2048
TRUNCATED = "[truncated]"


def cap_depth(stack: Sequence[_T], marker: _T, limit: int = MAX_STACK_DEPTH) -> Sequence[_T]:
    """A root-first stack of at most ``limit`` entries: the stack itself when
    it fits, else ``marker`` followed by its ``limit - 1`` leafmost entries."""
    if len(stack) <= limit:
        return stack
    return [marker, *stack[len(stack) - limit + 1:]]


class FrameKind(enum.StrEnum):
    USER = "user"             # includes markers inside the user part ([lost user stack])
    KERNEL = "kernel"         # likewise for the kernel part
    SYNTHETIC = "synthetic"   # ember's frames outside both parts: thread states


@dataclass(frozen=True, slots=True)
class Mapping:
    """An object mapped into memory (pprof Mapping)."""

    start: int
    limit: int
    offset: int
    path: str
    build_id: str = ""
    has_functions: bool = True
    # ELF facts Parca's WriteRaw wants per mapping (ExecutableInfo); 0 = unknown
    elf_type: int = 0           # ET_EXEC 2, ET_DYN 3
    load_offset: int = 0        # file offset of the executable PT_LOAD
    load_vaddr: int = 0         # its virtual address


KERNEL_MAPPING = Mapping(start=0xFFFF800000000000, limit=0xFFFFFFFFFFFFFFFF, offset=0,
                         path="[kernel.kallsyms]")


@dataclass(frozen=True, slots=True)
class Frame:
    name: str
    kind: FrameKind
    mapping: Mapping | None = None
    address: int = 0            # runtime address (0 for synthetic frames)
    system_name: str = ""       # the raw (mangled) symbol name, when different
    # Source position (DWARF, only when lines are asked for): the line being
    # executed in this function, or for a caller the line of the call.
    file: str = ""
    line: int = 0
    # Inlined into the frame below it (towards the root): same address, same
    # pprof Location, one Line entry each.
    inlined: bool = False

    @classmethod
    def marker(cls, name: str, kind: FrameKind = FrameKind.SYNTHETIC) -> Frame:
        """A frame ember made up (no address) to keep a sample visible."""
        return cls(name=name, kind=kind)

    def __reduce__(self) -> tuple[type[Frame], tuple[object, ...]]:
        """Pickled as its fields, made again by ``__init__``: the default for
        a slotted dataclass sets each field in a Python loop, and 5,000
        frames (what a decode worker sends for a profile of a program new to
        it) took 14-23 ms to pickle and 13 ms to load, against 3.4 and 5.5."""
        return (Frame, (self.name, self.kind, self.mapping, self.address, self.system_name,
                        self.file, self.line, self.inlined))


@dataclass(frozen=True, slots=True)
class Sample:
    frames: tuple[Frame, ...]   # root first
    values: tuple[int, ...]     # one per ProfileType.sample_types
    pid: int
    tid: int
    thread_name: str
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ProfileType:
    name: str                                  # "cpu", "offcpu"
    sample_types: tuple[tuple[str, str], ...]  # (type, unit) pairs
    period_type: tuple[str, str]
    period: int
    folded_index: int                          # which value folded output shows
    folded_scale: int = 1                      # divide that value by this


@dataclass(frozen=True)
class ProfileKind:
    """A kind of profile ember makes. ``PROFILE_KINDS`` is the one table of
    them: config choices, ``--mode``, series names, query aliases, which BPF
    program runs and which of its counts each kind reads all derive from it.
    Adding a kind means a row here, its counting in BPF, and its test."""

    name: str                   # config key, --mode, query alias, ProfileType.name
    help: str                   # one line for --help
    sample_types: tuple[tuple[str, str], ...]   # (events, count), then the main value
    program: str                # the BPF program that makes it (kernel/programs.py)
    counts_kind: int            # abi.KIND_*: its entries in ember_counts
    mode: int = 0               # abi.MODE_*: the bit that turns it on in a shared program
    exact_program: str = ""     # the program that times every event when sampling is off
    clock: bool = False         # sampled by the cpu-clock: one sample stands for 1s/frequency

    @property
    def series(self) -> str:
        """The WriteRaw ``__name__`` of its profiles."""
        return f"ember_{self.name}"

    @property
    def stored_type(self) -> str:
        """How the collector names the type (series:type:unit:period type:unit)."""
        kind, unit = self.sample_types[-1]
        return f"{self.series}:{kind}:{unit}:{kind}:{unit}"

    def profile_type(self, frequency: int = 0) -> ProfileType:
        """The pprof shape: a clock-sampled kind counts samples of
        ``1 s / frequency``; the others count time in nanoseconds (folded
        output shows it in microseconds)."""
        if self.clock:
            return ProfileType(self.name, self.sample_types, self.sample_types[-1],
                               period=1_000_000_000 // frequency, folded_index=0)
        return ProfileType(self.name, self.sample_types, self.sample_types[-1], period=1,
                           folded_index=1, folded_scale=1000)


CPU = ProfileKind("cpu", "on-CPU samples", (("samples", "count"), ("cpu", "nanoseconds")),
                  program="cpu", counts_kind=abi.KIND_ONCPU, clock=True)
OFFCPU = ProfileKind("offcpu", "time blocked", (("blocks", "count"), ("off_cpu", "nanoseconds")),
                     program="offcpu", exact_program="sched", counts_kind=abi.KIND_BLOCKED,
                     mode=abi.MODE_BLOCKED)
RUNQLAT = ProfileKind("runqlat", "time runnable threads waited for a CPU",
                      (("waits", "count"), ("runqueue", "nanoseconds")),
                      program="sched", counts_kind=abi.KIND_RUNQ, mode=abi.MODE_RUNQ)
WAKEUP = ProfileKind("wakeup", "wakers' stacks by the time their wakees were blocked",
                     (("wakeups", "count"), ("blocked", "nanoseconds")),
                     program="sched", counts_kind=abi.KIND_WAKEUP, mode=abi.MODE_WAKEUP)
OFFWAKE = ProfileKind("offwake", "blocked stacks joined with their wakers'",
                      (("wakeups", "count"), ("off_cpu", "nanoseconds")),
                      program="sched", counts_kind=abi.KIND_OFFWAKE, mode=abi.MODE_OFFWAKE)

#: Every profile kind, in the order they are listed and attached.
PROFILE_KINDS: tuple[ProfileKind, ...] = (CPU, OFFCPU, RUNQLAT, WAKEUP, OFFWAKE)
KIND_NAMES: tuple[str, ...] = tuple(k.name for k in PROFILE_KINDS)


def profile_kind(name: str) -> ProfileKind:
    """The kind of that name (KeyError naming the known ones otherwise)."""
    for k in PROFILE_KINDS:
        if k.name == name:
            return k
    raise KeyError(f"unknown profile kind {name!r} (one of {', '.join(KIND_NAMES)})")


def cpu_type(frequency: int) -> ProfileType:
    return CPU.profile_type(frequency)


OFFCPU_TYPE = OFFCPU.profile_type()
#: Time runnable threads waited for a CPU (after a wakeup, or preempted).
RUNQ_TYPE = RUNQLAT.profile_type()
#: Wakers' stacks, weighted by how long the threads they woke had been blocked.
WAKEUP_TYPE = WAKEUP.profile_type()
#: Blocked stacks joined with their wakers' stacks, weighted by blocked time.
OFFWAKE_TYPE = OFFWAKE.profile_type()


@dataclass(frozen=True)
class Profile:
    type: ProfileType
    samples: tuple[Sample, ...]
    start_ns: int                 # wall clock, Unix epoch
    duration_ns: int
    labels: MappingABC[str, str] = field(default_factory=dict)
    comments: tuple[str, ...] = ()

    def total(self, index: int) -> int:
        return sum(s.values[index] for s in self.samples)


def location_groups(frames: Sequence[Frame]) -> list[list[Frame]]:
    """A stack (root first) as pprof/OTLP Locations, leaf first: each group
    is a frame preceded by the frames inlined into it, innermost first, as
    Location.line lists them."""
    groups: list[list[Frame]] = []
    group: list[Frame] = []
    for f in reversed(frames):  # leaf first: inlined frames come before their host
        group.append(f)
        if not f.inlined:
            groups.append(group)
            group = []
    if group:  # inlined frames without a host frame (should not happen)
        groups.append(group)
    return groups


def merge_samples(samples: Iterable[Sample]) -> tuple[Sample, ...]:
    """Sum samples with the same frames, thread and labels."""
    acc: dict[tuple[object, ...], list[int]] = {}
    proto: dict[tuple[object, ...], Sample] = {}
    for s in samples:
        key = (s.frames, s.pid, s.tid, s.thread_name, s.labels)
        if key in acc:
            acc[key] = [a + b for a, b in zip(acc[key], s.values, strict=True)]
        else:
            acc[key] = list(s.values)
            proto[key] = s
    return tuple(Sample(p.frames, tuple(acc[k]), p.pid, p.tid, p.thread_name, p.labels)
                 for k, p in proto.items())
