"""ember's BPF programs: the one table of them.

Each row says which file in ``bpf/`` a program is, which functions to load
and where to attach them, how many stack maps rotate with its epoch, which
extra maps it keeps, and its share of the kernel memory budget. Building,
attaching, draining, the host checks, the map budget and the metrics'
``type`` label all derive from this table; profile kinds name their program
by ``ProgramKind.name`` (model.PROFILE_KINDS).

Build-time parameters reach the C code as ``-D`` flags; the defaults live in
``bpf/ember.h``, mirrored once in ``abi.DEFAULT_DEFINES`` (checked by
tests/test_abi.py). A spec passes only what differs from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .. import abi
from ..errors import BpfError
from .btf import task_offsets

#: bcc's clang warns about the Debian kernel headers themselves; those are not
#: ours to fix, and ember's own code is compiled with -Wall on top.
HEADER_NOISE = ("-Wno-duplicate-decl-specifier", "-Wno-ignored-attributes",
                "-Wno-address-of-packed-member", "-Wno-unknown-warning-option")


def bpf_source_dir() -> Path:
    """ember/bpf in an installed package (package data), bpf/ in a checkout."""
    package = Path(__file__).resolve().parents[1]  # ember/
    for candidate in (package / "bpf", package.parents[1] / "bpf"):
        if (candidate / "ember.h").is_file():
            return candidate
    raise BpfError(f"BPF sources not found next to {package}")


@dataclass(frozen=True)
class Hook:
    """One BPF function and where it attaches:

    - ``perf_event``: a cpu-clock perf event on every online CPU;
    - ``tracepoint/<category>/<name>``: a classic tracepoint (its id from tracefs);
    - ``tp_btf/<name>``: a BTF tracepoint (typed arguments, no tracefs);
    - ``iter/task``: a task iterator, run when its file is read (a census).
    """

    function: str
    point: str
    optional: bool = False   # attached only when the session asks for it
    # it walks user stacks from CFI tables: its step program (loaded for the
    # same hook: a tracing program may only tail-call those) and prog array
    # are ember_unwind_step_<unwind> and ember_unwind_progs_<unwind>
    unwind: str = ""

    @property
    def unwind_step(self) -> tuple[str, str] | None:
        """(step function, prog array) of a hook that unwinds from tables."""
        if not self.unwind:
            return None
        return f"ember_unwind_step_{self.unwind}", f"ember_unwind_progs_{self.unwind}"

    @property
    def load_kind(self) -> str:
        """How the build child loads the function (ProgramSpec.functions)."""
        return "tracepoint" if self.point.startswith("tracepoint/") else self.point

    @property
    def label(self) -> str:
        """The key of the loaded program in Built.progs."""
        return f"{self.function}@{self.load_kind}"


#: In every program (common.h): note a process again when it execs.
EXEC_HOOK = Hook("ember_on_exec", "tp_btf/sched_process_exec")
#: The optional hooks a session can ask for, by what they are for.
SYS_EXIT_HOOK = "tp_btf/sys_exit"


@dataclass(frozen=True)
class ProgramSpec:
    """What the build child compiles: a source file, -D flags, functions."""

    source: str                     # file in bpf/
    defines: dict[str, int] = field(default_factory=dict)
    # (function, load kind): "perf_event", "tracepoint" or "tp_btf/<tracepoint>";
    # Built.progs names each "<function>@<load kind>"
    functions: tuple[tuple[str, str], ...] = ()
    # (prog array, program label): the build puts the program at index 0
    tail_calls: tuple[tuple[str, str], ...] = ()

    def cflags(self, strict: bool = False) -> list[str]:
        flags = [f"-I{bpf_source_dir()}", *HEADER_NOISE]
        if strict:
            flags += ["-Wall", "-Werror"]
        flags += [f"-D{k}={v}" for k, v in sorted(self.defines.items())]
        return flags


@dataclass(frozen=True)
class ProgramKind:
    """One BPF program family (one C file and its maps)."""

    name: str                   # also the ``type`` label of the BPF metrics
    source: str                 # its file in bpf/
    hooks: tuple[Hook, ...]     # attached in this order, after EXEC_HOOK
    generations: int            # stack maps rotating with the epoch (kernel/drain.py)
    weight: float               # its share of bpf_map_memory beside other programs
    block_sampling: bool = False   # duration-weighted off-CPU: kernel stacks of
                                   # sleeping threads in ember_tstacks_* maps too
    tracks_blocks: bool = False    # ember_starts, ember_wakes, ember_runq_hist
    reads_tasks: bool = False      # task_struct fields at offsets from BTF (census.h)

    @property
    def stack_maps(self) -> int:
        """Maps of EMBER_STACK_ENTRIES stacks it creates."""
        return self.generations * (2 if self.block_sampling else 1)

    @property
    def needs_tracefs(self) -> bool:
        return any(h.point.startswith("tracepoint/") for h in self.hooks)

    def all_hooks(self) -> tuple[Hook, ...]:
        return (EXEC_HOOK, *self.hooks)

    def spec(self, stack_entries: int | None = None, count_entries: int | None = None,
             unwind_rows: int = 0) -> ProgramSpec:
        """The build spec; map sizes default to the header's. unwind_rows > 0
        compiles the table unwinder in, with that many rows."""
        defines = {"EMBER_STACK_GENERATIONS": self.generations}
        if self.reads_tasks:
            defines.update(task_offsets())
        if stack_entries is not None:
            defines["EMBER_STACK_ENTRIES"] = stack_entries
        if count_entries is not None:
            defines["EMBER_COUNT_ENTRIES"] = count_entries
        pairs = [(h.function, h.load_kind) for h in self.all_hooks()]
        tail_calls = []
        if unwind_rows:
            defines["EMBER_UNWIND"] = 1
            defines["EMBER_UNWIND_ROWS"] = unwind_rows
            for h in self.all_hooks():
                if h.unwind_step is not None:
                    step, array = h.unwind_step
                    # the step first: it makes its prog array belong to its hook
                    pairs.insert(0, (step, h.load_kind))
                    tail_calls.append((array, f"{step}@{h.load_kind}"))
        functions = tuple(dict.fromkeys(pairs))
        return ProgramSpec(self.source, defines, functions, tuple(dict.fromkeys(tail_calls)))

    @property
    def unwinds(self) -> bool:
        """Can it walk user stacks from CFI tables?"""
        return any(h.unwind for h in self.hooks)


PROGRAMS: tuple[ProgramKind, ...] = (
    # On-CPU: a cpu-clock sample of every CPU adds one to its stacks' count.
    ProgramKind("cpu", "oncpu.c", (Hook("ember_on_cpu", "perf_event", unwind="cpu"),),
                generations=2, weight=2.0),
    # Off-CPU with duration-weighted sampling (the default off-CPU profile).
    # The resume hooks go first: a block chosen at switch-in is never left
    # without one; sched_waking before sched_switch, so a block is never
    # timed without its wakeup.
    ProgramKind("offcpu", "offcpu_sampled.c",
                (Hook("ember_sampled_resume", "tp_btf/rseq_update", unwind="resume"),
                 Hook("ember_sampled_resume_exit", SYS_EXIT_HOOK, optional=True,
                      unwind="resume_exit"),
                 Hook("ember_sampled_waking", "tp_btf/sched_waking"),
                 Hook("ember_sampled_switch", "tp_btf/sched_switch", unwind="switch"),
                 # run by each drain: the blocks in flight, charged up to it
                 Hook("ember_sampled_census", "iter/task")),
                generations=3, weight=1.5, block_sampling=True, reads_tasks=True),
    # Every block timed, split at the wakeup: off-CPU with sampling off, run
    # queue, wakeup and off-wake. sched_waking goes first so a block is never
    # seen switching in without its wakeup.
    ProgramKind("sched", "offcpu.c",
                (Hook("ember_sched_waking", "tracepoint/sched/sched_waking", unwind="sched"),
                 Hook("ember_sched_switch", "tracepoint/sched/sched_switch", unwind="sched")),
                generations=3, weight=1.5, tracks_blocks=True),
    # Not a profile: what every thread of the targets is doing now (ember
    # dump; threads already blocked when recording starts).
    ProgramKind("census", "census.c", (Hook("ember_census", "iter/task"),),
                generations=2, weight=0.0, reads_tasks=True),
)


def program_kind(name: str) -> ProgramKind:
    for p in PROGRAMS:
        if p.name == name:
            return p
    raise KeyError(f"no BPF program {name!r} (one of {', '.join(p.name for p in PROGRAMS)})")


# --- map sizes from one budget ------------------------------------------------------

#: Approximate kernel bytes per entry (value + element and bucket overhead).
STACK_ENTRY_BYTES = 1100      # 127 addresses
UNWIND_ROW_BYTES = 16         # an ember_unwind_row in an array (values 8-aligned)
UNWIND_PROC_BYTES = 4200      # an ember_unwind_proc: 128 mappings
MIN_UNWIND_ROWS = 1 << 16
COUNT_ENTRY_BYTES = 200       # ember_key + ember_value in a preallocated hash
MIN_STACK_ENTRIES = 1024
MIN_COUNT_ENTRIES = 2048


def _pow2_floor(n: int, least: int) -> int:
    n = max(n, least)
    return 1 << (n.bit_length() - 1)


@dataclass(frozen=True)
class MapSizes:
    """Entries of a program's sized maps."""

    stacks: int
    counts: int
    unwind_rows: int = 0   # 0: no table unwinder


def map_entries(budget: int, programs: Sequence[ProgramKind], unwind: bool = False
                ) -> dict[str, MapSizes]:
    """Map sizes per program, from the kernel memory budget for all of
    ember's maps (bpf_map_memory). Without the table unwinder, stack storage
    takes 85% of a program's share and counts the rest; with it (programs
    that can unwind), the rows of the unwind tables take 40% first and the
    table-walked stacks double the stack maps. Powers of two, at least 1024
    stacks, 2048 counts and 65536 rows each."""
    total = sum(p.weight for p in programs) or 1.0
    out = {}
    for p in programs:
        share = budget * p.weight / total
        rows = 0
        stack_maps = p.stack_maps
        if unwind and p.unwinds:
            rows = _pow2_floor(int(share * 0.4 / UNWIND_ROW_BYTES), MIN_UNWIND_ROWS)
            share -= rows * UNWIND_ROW_BYTES + UNWIND_PROC_BYTES * UNWIND_PROCS
            stack_maps += p.generations
        stacks = _pow2_floor(int(share * 0.85 / (stack_maps * STACK_ENTRY_BYTES)),
                             MIN_STACK_ENTRIES)
        counts = _pow2_floor(int(share * 0.15 / COUNT_ENTRY_BYTES), MIN_COUNT_ENTRIES)
        out[p.name] = MapSizes(stacks, counts, rows)
    return out


#: Processes with unwind tables at once.
UNWIND_PROCS = abi.DEFAULT_DEFINES["EMBER_UNWIND_PROCS"]


#: The default of bpf_map_memory (config and ``ember record``).
DEFAULT_MAP_MEMORY = 64 << 20
