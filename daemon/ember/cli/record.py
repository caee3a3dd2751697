"""``ember record``: its arguments, and a run that hands them to the Recorder.

The flags follow perf and py-spy: ``-p PID``, ``-F HZ``, ``-o FILE``, ``-d
DURATION`` (with units: ``10s``, ``2m``), and ``ember record [OPTIONS] --
COMMAND ARGS...`` starts COMMAND and profiles it. While it runs, a progress
line goes to standard error when that is a terminal; at the end one line
says what was written: ``wrote FILE (N stacks, M samples)``, counted in the
file itself.

COMMAND is started as perf starts its workload: forked, held until the
programs are attached, then exec'd in the same process, so its first
instructions are profiled. Like ``--pid``, the filter follows the process
and its threads, not the children it starts. The recording ends when
COMMAND exits or the duration passes (COMMAND then gets SIGTERM, as with
timeout(1), and SIGKILL 5 s later); ember exits with COMMAND's status when
COMMAND ended the recording (128+N for signal N), else 0 (the duration, or
Ctrl-C or SIGTERM sent to ember).

The profile kinds (``--mode``) come from ``model.PROFILE_KINDS``, so a new
kind shows up here with no change; the values themselves are checked once,
by ``RecordOptions.validate``."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from .. import model
from ..errors import UsageError
from ..symbols import DEFAULT_DEBUG_DIRS
from ..unwind import UNWINDERS
from ._common import (
    Command,
    check_output,
    duration_arg,
    int_arg,
    log,
    stop_event,
    write,
)

if TYPE_CHECKING:
    from ..record import Progress, Recorder

#: kernel counters that mean samples were lost; the summary names them
_LOSSES = ("counts_full", "user_stack_collision", "kernel_stack_collision",
           "user_stack_error", "kernel_stack_error", "threads_full")
#: A recording shows its progress line once it has run this long: a short
#: one says nothing until its last line.
PROGRESS_AFTER_S = 2.0
#: How long COMMAND has to exit after SIGTERM before it gets SIGKILL.
TERM_GRACE_S = 5.0


def _mode_help() -> str:
    kinds = "; ".join(f"{k.name}: {k.help}" for k in model.PROFILE_KINDS)
    return f"{kinds} (default {model.CPU.name})"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.usage = "%(prog)s [OPTIONS] [-- COMMAND [ARG ...]]"
    # not dest "command": that is the subcommand's name (cli.main)
    p.add_argument("workload", nargs="*", metavar="COMMAND",
                   help="after --: a command to start and profile (its process and "
                        "threads) until it exits; ember then exits with its status")
    p.add_argument("--mode", choices=model.KIND_NAMES, default=model.CPU.name,
                   help=_mode_help())
    p.add_argument("--pid", "-p", type=int_arg, action="append", default=[],
                   help="profile only this process and its threads (repeatable); "
                        "default: all")
    p.add_argument("--duration", "-d", type=duration_arg, default=None, metavar="DURATION",
                   help="how long to record, e.g. 10s, 2m, 500ms (a bare number is "
                        "seconds); default: until COMMAND exits or Ctrl-C. With a "
                        "COMMAND still running then, it gets SIGTERM")
    p.add_argument("--frequency", "-F", type=int_arg, default=99,
                   help="on-CPU samples per second per CPU (default 99)")
    p.add_argument("--format", choices=("folded", "pprof"), default="folded")
    p.add_argument("--output", "-o", default=None,
                   help="file to write; default: standard output, or with a COMMAND "
                        "NAME-DATETIME.folded (.pb.gz) in the current directory")
    p.add_argument("--kernel-stacks", action=argparse.BooleanOptionalAction, default=True,
                   help="record kernel stacks (default: yes)")
    p.add_argument("--user-stacks", action=argparse.BooleanOptionalAction, default=True,
                   help="record user stacks (default: yes)")
    p.add_argument("--delimiter", action="store_true",
                   help="folded: a '-' frame between user and kernel frames (no short "
                        "form: -d is --duration, as in py-spy)")
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
    output = args.output
    executable = _executable(args.workload[0]) if args.workload else ""
    if args.workload and output is None:  # the command writes to standard output
        output = default_output(args.workload[0], args.format)
    if args.format == "pprof" and output is None and sys.stdout.isatty():
        raise UsageError("pprof output is binary: give --output FILE or redirect stdout")
    check_output(output)
    # forked before any thread of ember's starts (see Workload)
    workload = Workload(executable, args.workload) if args.workload else None
    line = ProgressLine(sys.stderr, model.profile_kind(args.mode),
                        args.workload[0] if args.workload else None)
    stop = stop_event()
    try:
        if workload is not None:
            options = replace(options, pids=(*options.pids, workload.pid))
        recorder = Recorder(options)
        recorder.start()
        if workload is not None:
            workload.release()
        profile = recorder.run(stop, until=workload.exited if workload else None,
                               progress=line, on_end=workload.terminate if workload else None)
    finally:
        line.clear()
        status = workload.end() if workload is not None else None
    if args.format == "pprof":
        data = encode_pprof(profile)
    else:
        data = encode_folded(profile, delimiter=args.delimiter).encode()
    write(output, data)
    _losses(recorder, args.mode)
    print(f"ember record: wrote {output or 'standard output'} "
          f"({file_summary(data, args.format, model.profile_kind(args.mode))})",
          file=sys.stderr)
    # Ctrl-C (or SIGTERM) to ember ends a recording on purpose: 0, as without
    # a COMMAND, whether or not the terminal's SIGINT reached COMMAND first
    return 0 if status is None or stop.is_set() else status


def _executable(name: str) -> str:
    """The file COMMAND names, looked up in PATH as a shell would; a
    UsageError before anything starts when there is none."""
    found = shutil.which(name)
    if found is None:
        if "/" in name and Path(name).is_file():
            raise UsageError(f"cannot run {name}: permission denied")
        raise UsageError(f"command not found: {name}")
    return found


def default_output(command: str, fmt: str) -> str:
    """py-spy's habit: NAME-DATETIME.EXT in the current directory."""
    name = Path(command).name or "record"
    ext = "pb.gz" if fmt == "pprof" else "folded"
    return f"{name}-{time.strftime('%Y%m%dT%H%M%S')}.{ext}"


class Workload:
    """COMMAND ARGS, started as perf starts its workload: forked and held
    on a pipe until the programs are attached, then exec'd in the same
    process (same PID), so its first instructions are profiled.

    Forked, not spawned through subprocess: Popen waits for the exec, which
    must wait for the attach. The fork happens before ember starts any
    thread, and the child runs nothing but a read and an exec."""

    def __init__(self, executable: str, argv: list[str]) -> None:
        gate_r, gate_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            status = 127
            try:
                os.close(gate_w)
                if os.read(gate_r, 1) == b"":
                    status = 125  # ember went away before attaching
                else:
                    os.close(gate_r)
                    # Python ignores these; a shell's child would not
                    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                        signal.signal(sig, signal.SIG_DFL)
                    os.execv(executable, argv)
            except BaseException as exc:  # nothing may return from here
                os.write(2, f"ember record: cannot run {argv[0]}: {exc}\n".encode())
            os._exit(status)
        os.close(gate_r)
        self.pid = pid
        self._gate: int | None = gate_w
        self._status: int | None = None
        self._stopped = False

    def release(self) -> None:
        """Let the command start."""
        if self._gate is not None:
            os.write(self._gate, b"g")
            os.close(self._gate)
            self._gate = None

    def exited(self) -> bool:
        return self.poll() is not None

    def poll(self) -> int | None:
        """Its exit status as a shell reports it (128+N for signal N), or
        None while it runs."""
        if self._status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                code = os.waitstatus_to_exitcode(status)
                self._status = 128 - code if code < 0 else code
        return self._status

    def terminate(self) -> None:
        """Ask the command to stop (SIGTERM) if it still runs; ``end``
        waits for it."""
        if self._gate is None and not self._stopped and self.poll() is None:
            self._stopped = True
            os.kill(self.pid, signal.SIGTERM)

    def end(self) -> int | None:
        """Make sure the command is gone: its exit status if it ended by
        itself, None if ember stopped it (not let go yet: its gate closes
        and it exits; let go: SIGTERM, and SIGKILL after TERM_GRACE_S)."""
        if self.poll() is not None:
            return None if self._stopped else self._status
        if self._gate is not None:
            os.close(self._gate)
            self._gate = None
        elif not self._stopped:
            os.kill(self.pid, signal.SIGTERM)
        self._stopped = True
        deadline = time.monotonic() + TERM_GRACE_S
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if self._status is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self._status = 128 + signal.SIGKILL
        return None


class ProgressLine:
    """``ember record: 7s left, 1234 samples so far`` (without a duration:
    ``12s, 1234 samples so far (Ctrl-C stops)``) on one line of a terminal,
    rewritten after every drain once the recording has run a few seconds.
    Nothing when the stream is not a terminal (a log, a pipe): those get
    the final line only."""

    def __init__(self, stream: TextIO, kind: model.ProfileKind, command: str | None) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.unit = "samples" if kind.clock else kind.sample_types[0][0]
        self.until = f"until {Path(command).name} exits" if command else "Ctrl-C stops"
        self.shown = False

    def __call__(self, p: Progress) -> None:
        if not self.tty or p.elapsed < PROGRESS_AFTER_S:
            return
        text = (f"{math.ceil(p.left)}s left, {p.events} {self.unit} so far"
                if p.left is not None else
                f"{p.elapsed:.0f}s, {p.events} {self.unit} so far ({self.until})")
        self.stream.write(f"\rember record: {text}\x1b[K")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def file_summary(data: bytes, fmt: str, kind: model.ProfileKind) -> str:
    """``N stacks, M samples``, counted in the file as written: N distinct
    stacks (folded: its lines; pprof: its distinct location lists), M its
    sample total (for kinds that weigh by time, the time, in the file's
    unit, and in pprof also the events)."""
    if fmt == "pprof":
        from ..encode.pprof import decode_pprof

        p = decode_pprof(data)
        stacks = len({tuple(s.location_id) for s in p.sample})
        names = [p.string_table[t.type] for t in p.sample_type]
        totals = [sum(s.value[i] for s in p.sample) for i in range(len(names))]
        parts = [f"{totals[0]} {'samples' if kind.clock else names[0]}"]
        if not kind.clock:
            parts.append(f"{totals[1] // 1000} us {names[1]}")
    else:
        lines = data.splitlines()
        stacks = len(lines)
        total = sum(int(line.rpartition(b" ")[2]) for line in lines)
        parts = [f"{total} samples" if kind.clock else f"{total} us {kind.sample_types[-1][0]}"]
    return ", ".join([f"{stacks} stacks", *parts])


def _losses(recorder: Recorder, mode: str) -> None:
    """What the kernel counted and what was lost: a line on stderr when
    anything was lost (before the last line, ``wrote ...``), the rest
    with -v."""
    s = recorder.stats
    lost = {k: v for k, v in s.kernel.items() if v and k in _LOSSES}
    unit = "samples" if model.profile_kind(mode).clock else "events"
    log.info("ember record: the kernel counted %d %s in %d drains", s.drain.events, unit,
             s.drains)
    if s.drain.stacks_truncated or lost:
        print("ember record: "
              + "; ".join(([f"truncated stacks: {s.drain.stacks_truncated}"]
                           if s.drain.stacks_truncated else [])
                          + ([f"dropped: {lost}"] if lost else [])), file=sys.stderr)


COMMAND = Command(
    name="record", help="profile for a while and write one profile",
    description="Record on-CPU samples or off-CPU time through BPF: of the whole host, "
                "of --pid processes, or of a COMMAND ember starts (ember record [OPTIONS] "
                "-- COMMAND ARGS...). -d is --duration, as in py-spy (the folded "
                "delimiter, once -d, is --delimiter).",
    add_arguments=add_arguments, run=run)
