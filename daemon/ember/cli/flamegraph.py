"""``ember flamegraph``: its arguments, and a run that renders through the
flamegraph stage and writes an SVG or an HTML page. Inputs may be collector
URLs, fetched with --token-file and --ca; every input is bounded by
--max-input-size."""

from __future__ import annotations

import argparse

from ..errors import UsageError
from ._common import (
    Command,
    add_collector_access,
    add_max_input_size,
    collector_token,
    int_arg,
    write_graph,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input")
    p.add_argument("--output", "-o", help="OUT.svg or OUT.html (default: SVG on stdout)")
    p.add_argument("--title")
    p.add_argument("--countname", default="samples",
                   help="what folded counts are; ns, us, ms or s mean time (default samples)")
    p.add_argument("--palette", choices=("auto", "hot", "io"), default="auto")
    p.add_argument("--inverted", action="store_true", help="icicle layout: root at the top")
    p.add_argument("--width", type=int_arg, default=1200)
    p.add_argument("--cold", metavar="OFFCPU_INPUT",
                   help="hot/cold: add this off-CPU profile; widths in time")
    p.add_argument("--frequency", type=int_arg,
                   help="hot/cold with folded on-CPU input: its sampling frequency")
    add_max_input_size(p)
    add_collector_access(p)


def run(args: argparse.Namespace) -> int:
    if args.width < 100:
        raise UsageError("--width must be at least 100")
    from ..flamegraph.graphs import flamegraph

    text = flamegraph(args.input, args.title, args.countname, args.palette, args.inverted,
                      args.width, args.cold, args.frequency, token=collector_token(args),
                      cafile=args.ca, max_size=args.max_input_size)
    write_graph(args.output, text, args.title or "ember flame graph")
    return 0


COMMAND = Command(
    name="flamegraph", help="render folded stacks or pprof as an interactive SVG",
    description="Render a flame graph: INPUT is folded stacks, a pprof "
                "file, - (stdin), or a collector query URL (with --token-file "
                "and --ca when the collector needs them).",
    add_arguments=add_arguments, run=run)
