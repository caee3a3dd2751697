"""The table of BPF programs: specs from it, map sizes from one budget."""

from __future__ import annotations

from ember import abi
from ember.kernel.programs import (
    COUNT_ENTRY_BYTES,
    EXEC_HOOK,
    PROGRAMS,
    STACK_ENTRY_BYTES,
    map_entries,
    program_kind,
)
from ember.model import PROFILE_KINDS
from tests.support import ROOT


def test_map_entries_stay_within_budget() -> None:
    cpu, offcpu, sched = (program_kind(n) for n in ("cpu", "offcpu", "sched"))
    for budget in (8 << 20, 64 << 20, 1 << 30):
        for programs in ([cpu], [cpu, offcpu], [cpu, offcpu, sched]):
            entries = map_entries(budget, programs)
            used = sum(entries[p.name][0] * p.stack_maps * STACK_ENTRY_BYTES
                       + entries[p.name][1] * COUNT_ENTRY_BYTES for p in programs)
            floor = sum(1024 * p.stack_maps * STACK_ENTRY_BYTES + 2048 * COUNT_ENTRY_BYTES
                        for p in programs)
            assert used <= max(budget, floor), (budget, programs, entries)
            for s, c in entries.values():
                assert s & (s - 1) == 0 and c & (c - 1) == 0  # powers of two
    # more budget, bigger maps
    assert map_entries(256 << 20, [cpu])["cpu"][0] > map_entries(32 << 20, [cpu])["cpu"][0]


def test_specs_pass_only_what_differs_from_the_header() -> None:
    for p in PROGRAMS:
        spec = p.spec()
        assert spec.defines == {"EMBER_STACK_GENERATIONS": p.generations}
        assert (EXEC_HOOK.function, EXEC_HOOK.load_kind) in spec.functions
        assert (ROOT / "bpf" / p.source).is_file()
        assert set(spec.defines) <= set(abi.DEFAULT_DEFINES)
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
