"""``ember dump``: every thread's state now, since when, and its stack."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..errors import UsageError
from ._common import Command, duration_arg, int_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pid", "-p", type=int_arg, action="append", default=None,
                   help="dump this process's threads (repeatable); default: every process")
    p.add_argument("--watch", type=duration_arg, default=0, metavar="DURATION",
                   help="dump again every DURATION (e.g. 2s, 500ms; a bare number is "
                        "seconds) until Ctrl-C")
    p.add_argument("--json", action="store_true", help="one JSON object per thread and line")
    p.add_argument("--include-self", action="store_true", help="ember's own threads too")


def run(args: argparse.Namespace) -> int:
    from ..threads import Dumper, render

    if args.watch < 0:
        raise UsageError(f"--watch cannot be negative, not {args.watch:g}")
    dumper = Dumper.standalone(include_self=args.include_self)
    try:
        while True:
            reports = dumper.take(args.pid)
            if args.json:
                out = "".join(json.dumps(r.as_json()) + "\n" for r in reports)
            else:
                out = render(reports)
            if args.watch and sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[2J")
            sys.stdout.write(out)
            sys.stdout.flush()
            if not args.watch:
                return 0
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0
    finally:
        dumper.close()


COMMAND = Command(
    name="dump", help="what every thread is doing now",
    description="Print each thread's state (running, runnable, or blocked and in "
                "what), how long it has been off the CPU, and its stack (native user "
                "frames, then kernel frames marked [k]), the longest-blocked first. "
                "Needs the same privileges as ember record.",
    add_arguments=add_arguments, run=run)
