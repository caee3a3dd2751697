"""The ``ember`` command. Parses arguments, configures logging, runs one
subcommand, and turns ember's errors into one-line messages and exit codes
(2: bad input or a host that cannot run ember; 1: other failures)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

from . import __version__
from .errors import EmberError, OutputError, UsageError

log = logging.getLogger("ember")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _int(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    return value


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ember", description="eBPF continuous profiler")
    parser.add_argument("--version", action="version", version=f"ember {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (repeat for debug)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    rec = sub.add_parser("record", help="profile for a while and write one profile",
                         description="Record on-CPU samples or off-CPU time through BPF.")
    rec.add_argument("--mode", choices=("cpu", "offcpu"), default="cpu")
    rec.add_argument("--pid", type=_int, action="append", default=[],
                     help="profile only this process (repeatable); default: all")
    rec.add_argument("--duration", type=_float, default=None,
                     help="seconds to record; default: until Ctrl-C")
    rec.add_argument("--frequency", type=_int, default=99,
                     help="on-CPU samples per second per CPU (default 99)")
    rec.add_argument("--format", choices=("folded", "pprof"), default="folded")
    rec.add_argument("--output", "-o", default=None,
                     help="file to write; default: standard output")
    rec.add_argument("--kernel-stacks", action=argparse.BooleanOptionalAction, default=True,
                     help="record kernel stacks (default: yes)")
    rec.add_argument("--user-stacks", action=argparse.BooleanOptionalAction, default=True,
                     help="record user stacks (default: yes)")
    rec.add_argument("--delimiter", "-d", action="store_true",
                     help="folded: a '-' frame between user and kernel frames")
    rec.add_argument("--min-block-us", type=_int, default=1,
                     help="off-CPU: ignore blocks shorter than this (default 1)")
    rec.add_argument("--max-block-us", type=_int, default=0,
                     help="off-CPU: ignore blocks longer than this (default: no limit)")
    rec.add_argument("--state", type=_int, default=None,
                     help="off-CPU: only threads switched out in these states, as a "
                          "bitmask of TASK_* bits (1 S, 2 D, ...); 0 means runnable "
                          "(preempted) only, as in bcc's offcputime")
    rec.add_argument("--include-self", action="store_true", help="profile ember itself too")
    rec.set_defaults(func=cmd_record)
    return parser


def _check_output(path: str | None) -> None:
    """Fail before profiling, not after, when the output cannot be written."""
    if path is None:
        return
    p = Path(path)
    try:
        if p.is_dir():
            raise OutputError(f"cannot write {path}: it is a directory")
        if p.exists() and not p.is_file():  # a device or FIFO: written in place
            if not os.access(p, os.W_OK):
                raise OutputError(f"cannot write {path}: permission denied")
            return
        parent = p.parent
        if not parent.is_dir():
            raise OutputError(f"cannot write {path}: directory {parent} does not exist")
        if (p.exists() and not os.access(p, os.W_OK)) or not os.access(parent, os.W_OK):
            raise OutputError(f"cannot write {path}: permission denied")
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from exc


def _write(path: str | None, data: bytes) -> None:
    """Write the profile: regular files atomically (temporary file + rename),
    so a reader never sees half a profile; devices and FIFOs in place."""
    if path is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    p = Path(path)
    try:
        if p.exists() and not p.is_file():
            with open(p, "wb") as f:
                f.write(data)
            return
        tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
        try:
            tmp.write_bytes(data)
            tmp.replace(p)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from exc


def cmd_record(args: argparse.Namespace) -> int:
    from .encode.folded import encode_folded
    from .encode.pprof import encode_pprof
    from .record import Recorder, RecordOptions

    options = RecordOptions(
        mode=args.mode, pids=tuple(args.pid), duration=args.duration, frequency=args.frequency,
        kernel_stacks=args.kernel_stacks, user_stacks=args.user_stacks,
        min_block_us=args.min_block_us, max_block_us=args.max_block_us, state=args.state,
        include_self=args.include_self,
    )
    options.validate()
    if args.format == "pprof" and args.output is None and sys.stdout.isatty():
        raise UsageError("pprof output is binary: give --output FILE or redirect stdout")
    _check_output(args.output)

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping (%s)", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    recorder = Recorder(options)
    profile = recorder.run(stop)
    if args.format == "pprof":
        data = encode_pprof(profile)
    else:
        data = encode_folded(profile, delimiter=args.delimiter).encode()
    _write(args.output, data)
    s = recorder.stats
    lost = {k: v for k, v in s.kernel.items()
            if v and k in ("counts_full", "user_stack_collision", "kernel_stack_collision",
                           "user_stack_error", "kernel_stack_error", "threads_full")}
    unit = "samples" if options.mode == "cpu" else "blocks"
    print(f"ember record: {s.drain.events} {unit}, {len(profile.samples)} stacks, "
          f"{s.drains} drains"
          + (f"; truncated stacks: {s.drain.stacks_truncated}" if s.drain.stacks_truncated else "")
          + (f"; dropped: {lost}" if lost else ""), file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * args.verbose
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(message)s")
    try:
        return int(args.func(args))
    except EmberError as exc:
        print(f"ember {args.command}: {exc}", file=sys.stderr)
        return exc.exit_status
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
