"""``ember diff``: its arguments, and a run that renders a differential flame
graph through the flamegraph stage (and, optionally, the two-column text).
Inputs may be collector URLs, fetched with --token-file and --ca; each is
bounded by --max-input-size."""

from __future__ import annotations

import argparse

from ..errors import UsageError
from ._common import (
    Command,
    add_collector_access,
    add_max_input_size,
    check_output,
    collector_token,
    int_arg,
    write,
    write_graph,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--output", "-o", help="OUT.svg or OUT.html (default: SVG on stdout)")
    p.add_argument("--folded", help="also write the two-column diff 'stack before after'")
    p.add_argument("--normalize", action="store_true", help="scale BEFORE to AFTER's total")
    p.add_argument("--strip-hex", action="store_true",
                   help="ignore raw addresses (0x...) so unknown frames compare")
    p.add_argument("--negate", action="store_true",
                   help="shapes from BEFORE, to show what vanished")
    p.add_argument("--title")
    p.add_argument("--countname", default="samples")
    p.add_argument("--width", type=int_arg, default=1200)
    add_max_input_size(p)
    add_collector_access(p)


def run(args: argparse.Namespace) -> int:
    from ..flamegraph.graphs import diff

    if args.width < 100:
        raise UsageError("--width must be at least 100")
    if args.folded:
        check_output(args.folded)
    text, two_column = diff(args.before, args.after, args.normalize, args.strip_hex,
                            args.negate, args.title, args.countname, args.width,
                            token=collector_token(args), cafile=args.ca,
                            max_size=args.max_input_size)
    write_graph(args.output, text, args.title or "ember differential flame graph")
    if args.folded:
        write(args.folded, two_column.encode())
    return 0


COMMAND = Command(
    name="diff", help="red/blue differential flame graph of two profiles",
    description="Shapes from AFTER; red where a frame grew, blue where it "
                "shrank, intensity by the size of the change. BEFORE and AFTER "
                "may be collector query URLs (with --token-file and --ca when "
                "the collector needs them).",
    add_arguments=add_arguments, run=run)
