"""``ember record``: its arguments, and a run that hands them to the Recorder.

The profile kinds (``--mode``) come from ``model.PROFILE_KINDS``, so a new
kind shows up here with no change; the values themselves are checked once,
by ``RecordOptions.validate``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from .. import model
from ..errors import UsageError
from ..symbols import DEFAULT_DEBUG_DIRS
from ..unwind import UNWINDERS
from ._common import Command, check_output, float_arg, int_arg, stop_event, write

if TYPE_CHECKING:
    from ..record import Recorder

#: kernel counters that mean samples were lost; the summary names them
_LOSSES = ("counts_full", "user_stack_collision", "kernel_stack_collision",
           "user_stack_error", "kernel_stack_error", "threads_full")


def _mode_help() -> str:
    kinds = "; ".join(f"{k.name}: {k.help}" for k in model.PROFILE_KINDS)
    return f"{kinds} (default {model.CPU.name})"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=model.KIND_NAMES, default=model.CPU.name,
                   help=_mode_help())
    p.add_argument("--pid", type=int_arg, action="append", default=[],
                   help="profile only this process (repeatable); default: all")
    p.add_argument("--duration", type=float_arg, default=None,
                   help="seconds to record; default: until Ctrl-C")
    p.add_argument("--frequency", type=int_arg, default=99,
                   help="on-CPU samples per second per CPU (default 99)")
    p.add_argument("--format", choices=("folded", "pprof"), default="folded")
    p.add_argument("--output", "-o", default=None,
                   help="file to write; default: standard output")
    p.add_argument("--kernel-stacks", action=argparse.BooleanOptionalAction, default=True,
                   help="record kernel stacks (default: yes)")
    p.add_argument("--user-stacks", action=argparse.BooleanOptionalAction, default=True,
                   help="record user stacks (default: yes)")
    p.add_argument("--delimiter", "-d", action="store_true",
                   help="folded: a '-' frame between user and kernel frames")
    _add_offcpu_arguments(p)
    p.add_argument("--include-self", action="store_true", help="profile ember itself too")
    p.add_argument("--unwinder", choices=tuple(UNWINDERS), default="auto",
                   help="how user stacks are walked: " + "; ".join(
                       f"{k}: {v}" for k, v in UNWINDERS.items()) + " (default auto)")
    p.add_argument("--python-frames", action=argparse.BooleanOptionalAction, default=True,
                   help="CPython 3.10-3.13: Python functions (and lines) in place of the "
                        "interpreter loop's frames; needs the table unwinder (default: yes)")
    p.add_argument("--lines", action="store_true",
                   help="source files and lines (DWARF), with inlined functions as frames "
                        "of their own; pprof output gets a Line per function in each "
                        "Location")
    p.add_argument("--debug-dir", action="append", default=None,
                   help="where separate debug files are (repeatable; default "
                        f"{', '.join(DEFAULT_DEBUG_DIRS)})")


def _add_offcpu_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-block-us", type=int_arg, default=1,
                   help="off-CPU: ignore blocks shorter than this (default 1)")
    p.add_argument("--max-block-us", type=int_arg, default=0,
                   help="off-CPU: ignore blocks longer than this (default: no limit)")
    p.add_argument("--sample-us", type=int_arg, default=1000,
                   help="off-CPU: blocks this long or longer are always recorded, shorter "
                        "ones with probability duration/sample-us and weighted by its "
                        "inverse (unbiased totals, a fraction of the cost); 0 records "
                        "every block (default 1000)")
    p.add_argument("--sys-exit-hook", action="store_true",
                   help="off-CPU: also take user stacks at system call exit, for programs "
                        "without rseq (Go, musl, glibc < 2.35); slows every system call")
    p.add_argument("--state", type=int_arg, default=None,
                   help="off-CPU: only threads switched out in these states, as a "
                        "bitmask of TASK_* bits (1 S, 2 D, ...); 0 means runnable "
                        "(preempted) only, as in bcc's offcputime")


def run(args: argparse.Namespace) -> int:
    from ..encode.folded import encode_folded
    from ..encode.pprof import encode_pprof
    from ..record import Recorder, RecordOptions

    options = RecordOptions(
        mode=args.mode, pids=tuple(args.pid), duration=args.duration, frequency=args.frequency,
        kernel_stacks=args.kernel_stacks, user_stacks=args.user_stacks,
        min_block_us=args.min_block_us, max_block_us=args.max_block_us, state=args.state,
        sample_us=args.sample_us, sys_exit_hook=args.sys_exit_hook,
        include_self=args.include_self, lines=args.lines, unwinder=args.unwinder,
        python_frames=args.python_frames,
        debug_dirs=tuple(args.debug_dir) if args.debug_dir else DEFAULT_DEBUG_DIRS,
    )
    options.validate()
    if args.format == "pprof" and args.output is None and sys.stdout.isatty():
        raise UsageError("pprof output is binary: give --output FILE or redirect stdout")
    check_output(args.output)
    stop = stop_event()
    recorder = Recorder(options)
    profile = recorder.run(stop)
    if args.format == "pprof":
        data = encode_pprof(profile)
    else:
        data = encode_folded(profile, delimiter=args.delimiter).encode()
    write(args.output, data)
    _summary(recorder, args.mode, len(profile.samples))
    return 0


def _summary(recorder: Recorder, mode: str, stacks: int) -> None:
    """One line on stderr: what was recorded and what was lost."""
    s = recorder.stats
    lost = {k: v for k, v in s.kernel.items() if v and k in _LOSSES}
    unit = "samples" if model.profile_kind(mode).clock else "events"
    print(f"ember record: {s.drain.events} {unit}, {stacks} stacks, {s.drains} drains"
          + (f"; truncated stacks: {s.drain.stacks_truncated}" if s.drain.stacks_truncated else "")
          + (f"; dropped: {lost}" if lost else ""), file=sys.stderr)


COMMAND = Command(
    name="record", help="profile for a while and write one profile",
    description="Record on-CPU samples or off-CPU time through BPF.",
    add_arguments=add_arguments, run=run)
