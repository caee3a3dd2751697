"""What a session plans from the profile kinds asked for (no kernel needed:
the programs' table, stack flags and ember_config), and the order of a
drain's steps across its programs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember import abi
from ember.errors import UsageError
from ember.kernel.drain import Drainer
from ember.model import CPU, OFFCPU, OFFWAKE, PROFILE_KINDS, RUNQLAT, WAKEUP
from ember.session import Pipeline, Session, SessionOptions
from ember.symbols.procmaps import ProcessTable, ProcFS
from ember.symbols.symbolizer import Symbolizer
from tests.support.fakes import FakeProgram, NoGrace


def names(options: SessionOptions) -> list[tuple[str, list[str]]]:
    return [(p.name, [k.name for k in kinds]) for p, kinds in options.plan()]


def test_one_program_serves_several_kinds() -> None:
    assert names(SessionOptions(PROFILE_KINDS)) == [
        ("cpu", ["cpu"]), ("offcpu", ["offcpu"]), ("sched", ["runqlat", "wakeup", "offwake"])]


def test_offcpu_takes_the_exact_program_when_sampling_is_off() -> None:
    assert names(SessionOptions((CPU, OFFCPU, RUNQLAT), sample_ns=0)) == [
        ("cpu", ["cpu"]), ("sched", ["offcpu", "runqlat"])]


def test_bpf_config_of_a_shared_program() -> None:
    o = SessionOptions((OFFCPU, WAKEUP, OFFWAKE), sample_ns=0, min_block_ns=5000,
                       user_stacks=frozenset({"wakeup"}), kernel_stacks=frozenset(),
                       include_self=True)
    [(_, kinds)] = o.plan()
    cfg = o.bpf_config(kinds)
    assert cfg.modes == abi.MODE_BLOCKED | abi.MODE_WAKEUP | abi.MODE_OFFWAKE
    assert cfg.stack_flags == abi.STACK_USER  # one of its kinds asks for user stacks
    assert (cfg.min_block_ns, cfg.sample_ns, cfg.self_tgid) == (5000, 0, 0)


def test_a_program_without_stacks_is_refused() -> None:
    with pytest.raises(UsageError, match="cpu records neither user nor kernel stacks"):
        SessionOptions((CPU, OFFCPU), user_stacks=frozenset({"offcpu"}),
                       kernel_stacks=frozenset()).plan()


def test_sys_exit_is_an_optional_hook() -> None:
    assert SessionOptions((OFFCPU,)).optional_hooks == frozenset()
    assert SessionOptions((OFFCPU,), sys_exit=True).optional_hooks == {"tp_btf/sys_exit"}


def test_every_program_flips_before_any_is_collected(tmp_path: Path) -> None:
    """A drain flips every program (writing its off-CPU boundary) before it
    collects and symbolizes any: a slow collecting of the first program
    does not put the second one's boundary later. (Flipped and collected
    one after the other, a loaded machine put an interval's off-CPU time 4%
    past the interval's length: the window ended at the first flip.)"""
    session = Session(SessionOptions((CPU, OFFCPU)), Symbolizer(ProcessTable(ProcFS(tmp_path))))
    now = [1_000]
    fakes = [FakeProgram(generations=3) for _ in range(2)]

    class Slow:
        ptype = CPU.profile_type(99)

        def build(self, records: object) -> list[object]:
            now[0] += 5 * 10**9   # symbolizing takes 5 s
            return []

    session.pipelines = [
        Pipeline(program=fake, drainer=Drainer(fake, NoGrace(), clock=lambda: now[0]),  # type: ignore[arg-type]
                 builders=[Slow()])  # type: ignore[list-item]
        for fake in fakes]
    for _ in range(3):
        session.drain()
        assert fakes[0].bounds == fakes[1].bounds, (fakes[0].bounds, fakes[1].bounds)
    assert len(set(fakes[0].bounds.values())) == 3   # (three drains, three boundaries)
