"""The table of BPF programs: specs from it, map sizes from one budget."""

from __future__ import annotations

from ember import abi
from ember.kernel.btf import task_offsets
from ember.kernel.programs import (
    COUNT_ENTRY_BYTES,
    EXEC_HOOK,
    PROGRAMS,
    STACK_ENTRY_BYTES,
    UNWIND_PROC_BYTES,
    UNWIND_PROCS,
    UNWIND_ROW_BYTES,
    map_entries,
    program_kind,
)
from ember.model import PROFILE_KINDS
from tests.support import ROOT


def test_map_entries_stay_within_budget() -> None:
    cpu, offcpu, sched = (program_kind(n) for n in ("cpu", "offcpu", "sched"))
    for unwind in (False, True):
        for budget in (8 << 20, 64 << 20, 1 << 30):
            for programs in ([cpu], [cpu, offcpu], [cpu, offcpu, sched]):
                entries = map_entries(budget, programs, unwind=unwind)
                used = floor = 0
                for p in programs:
                    e = entries[p.name]
                    maps = p.stack_maps + (p.generations if e.unwind_rows else 0)
                    tables = (e.unwind_rows * UNWIND_ROW_BYTES
                              + (UNWIND_PROCS * UNWIND_PROC_BYTES if e.unwind_rows else 0))
                    used += (e.stacks * maps * STACK_ENTRY_BYTES + e.counts * COUNT_ENTRY_BYTES
                             + tables)
                    floor += (1024 * maps * STACK_ENTRY_BYTES + 2048 * COUNT_ENTRY_BYTES
                              + (65536 * UNWIND_ROW_BYTES if e.unwind_rows else 0) + tables)
                    assert bool(e.unwind_rows) == (unwind and p.unwinds)
                    for n in (e.stacks, e.counts, e.unwind_rows):
                        assert n & (n - 1) == 0  # powers of two (or 0)
                assert used <= max(budget, floor), (budget, programs, entries)
    # more budget, bigger maps
    assert map_entries(256 << 20, [cpu])["cpu"].stacks > map_entries(32 << 20, [cpu])["cpu"].stacks


def test_specs_pass_only_what_differs_from_the_header() -> None:
    for p in PROGRAMS:
        spec = p.spec()
        # task_struct offsets come from the kernel's BTF, never from a default
        tasks = task_offsets() if p.reads_tasks else {}
        assert spec.defines == {"EMBER_STACK_GENERATIONS": p.generations, **tasks}
        assert (EXEC_HOOK.function, EXEC_HOOK.load_kind) in spec.functions
        assert (ROOT / "bpf" / p.source).is_file()
        assert set(spec.defines) - set(tasks) <= set(abi.DEFAULT_DEFINES)
    sized = program_kind("cpu").spec(4096, 8192).defines
    assert sized["EMBER_STACK_ENTRIES"] == 4096 and sized["EMBER_COUNT_ENTRIES"] == 8192


def test_every_hook_function_is_in_its_source() -> None:
    for p in PROGRAMS:
        text = (ROOT / "bpf" / p.source).read_text() + (ROOT / "bpf" / "common.h").read_text()
        for hook in p.all_hooks():
            assert f"int {hook.function}(" in text, (p.source, hook.function)


def test_every_profile_kind_has_its_programs() -> None:
    names = {p.name for p in PROGRAMS}
    for kind in PROFILE_KINDS:
        assert kind.program in names
        assert not kind.exact_program or kind.exact_program in names
