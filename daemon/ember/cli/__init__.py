"""The ``ember`` command. Parses arguments, configures logging, runs one
subcommand, and turns ember's errors into one-line messages and exit codes
(2: bad input or a host that cannot run ember; 1: other failures).

Each subcommand is a module of this package exposing a ``Command`` (its
arguments and its run); the parser is assembled from ``COMMANDS``. The
modules import only what building the parser needs; the rest of ember is
imported when a command runs, so ``ember --help`` starts fast."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from .. import __version__
from ..errors import EmberError
from . import agent, collector, diff, dump, flamegraph, query, record, reference, symbolize
from ._common import Command

#: every subcommand, in the order ``ember --help`` lists them
COMMANDS: tuple[Command, ...] = (
    record.COMMAND, agent.COMMAND, collector.COMMAND, query.COMMAND, flamegraph.COMMAND,
    diff.COMMAND, dump.COMMAND, symbolize.COMMAND, reference.CONFIG_REFERENCE,
    reference.METRICS_REFERENCE,
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(commands: Sequence[Command] = COMMANDS) -> argparse.ArgumentParser:
    parser = _Parser(prog="ember", description="eBPF continuous profiler")
    parser.add_argument("--version", action="version", version=f"ember {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (repeat for debug)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in commands:
        p = sub.add_parser(command.name, help=command.help, description=command.description)
        command.add_arguments(p)
        p.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * args.verbose
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(message)s")
    try:
        return int(args.run(args))
    except EmberError as exc:
        print(f"ember {args.command}: {exc}", file=sys.stderr)
        return exc.exit_status
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
