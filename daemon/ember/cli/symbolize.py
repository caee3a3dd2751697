"""``ember symbolize``: read hex addresses (arguments or stdin) and print
what ``symbols.describe`` makes of them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from ..errors import UsageError
from ..symbols import DEFAULT_DEBUG_DIRS
from ._common import Command, int_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pid", type=int_arg, required=True)
    p.add_argument("addresses", nargs="*", metavar="ADDR")
    p.add_argument("--debug-dir", action="append", default=None,
                   help=f"where separate debug files live (default "
                        f"{', '.join(DEFAULT_DEBUG_DIRS)}; repeatable)")
    p.add_argument("--lines", action="store_true",
                   help="after each address, its source lines from DWARF, innermost "
                        "(inlined) function first, one indented line each")


def addresses(words: list[str]) -> Iterator[int]:
    """The hex words given, or else those on stdin, as integers. Lazily:
    stdin is read only once describe() has found the process."""
    for word in words or sys.stdin.read().split():
        try:
            yield int(word, 16)
        except ValueError:
            raise UsageError(f"not a hex address: {word!r}") from None


def run(args: argparse.Namespace) -> int:
    from ..symbols.describe import describe

    out = describe(args.pid, addresses(args.addresses), args.debug_dir or DEFAULT_DEBUG_DIRS,
                   lines=args.lines)
    sys.stdout.write("".join(line + "\n" for line in out))
    return 0


COMMAND = Command(
    name="symbolize", help="name addresses of a live process",
    description="Print 'ADDR FUNCTION+OFFSET OBJECT' for each address "
                "(hex), from the arguments or one per line on stdin. "
                "Kernel addresses are named from /proc/kallsyms.",
    add_arguments=add_arguments, run=run)
