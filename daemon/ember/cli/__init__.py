"""The ``ember`` command. Parses arguments, configures logging, runs one
subcommand, and turns ember's errors into one-line messages and exit codes
(2: bad input or a host that cannot run ember; 1: other failures)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

from .. import __version__
from ..errors import EmberError, OutputError, UsageError

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
    rec.add_argument("--mode", choices=("cpu", "offcpu", "runqlat", "wakeup", "offwake"),
                     default="cpu", help="cpu: on-CPU samples; offcpu: time blocked; runqlat: "
                     "time runnable threads waited for a CPU; wakeup: wakers' stacks by the "
                     "time their wakees were blocked; offwake: blocked stacks joined with "
                     "their wakers' (default cpu)")
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
    rec.add_argument("--sample-us", type=_int, default=1000,
                     help="off-CPU: blocks this long or longer are always recorded, shorter "
                          "ones with probability duration/sample-us and weighted by its "
                          "inverse (unbiased totals, a fraction of the cost); 0 records "
                          "every block (default 1000)")
    rec.add_argument("--sys-exit-hook", action="store_true",
                     help="off-CPU: also take user stacks at system call exit, for programs "
                          "without rseq (Go, musl, glibc < 2.35); slows every system call")
    rec.add_argument("--state", type=_int, default=None,
                     help="off-CPU: only threads switched out in these states, as a "
                          "bitmask of TASK_* bits (1 S, 2 D, ...); 0 means runnable "
                          "(preempted) only, as in bcc's offcputime")
    rec.add_argument("--include-self", action="store_true", help="profile ember itself too")
    rec.add_argument("--lines", action="store_true",
                     help="source files and lines (DWARF), with inlined functions as frames "
                          "of their own; pprof output gets a Line per function in each "
                          "Location")
    rec.add_argument("--debug-dir", action="append", default=None,
                     help="where separate debug files are (repeatable; default "
                          "/usr/lib/debug)")
    rec.set_defaults(func=cmd_record)

    ag = sub.add_parser("agent", help="profile continuously and ship to a collector",
                        description="Profile on-CPU and off-CPU continuously; ship pprof "
                                    "profiles to a collector over gRPC (Parca WriteRaw).")
    ag.add_argument("--config", help="YAML config file (see config/ember.yaml)")
    ag.add_argument("--collector", help="collector gRPC address HOST:PORT")
    ag.add_argument("--interval", help="drain and ship interval, e.g. 10s")
    ag.add_argument("--pid", type=_int, action="append", default=[],
                    help="profile only this process (repeatable)")
    ag.add_argument("--metrics-listen", help="HOST:PORT for /metrics, /healthz, /readyz")
    ag.add_argument("--spool-dir", help="directory of the on-disk spool")
    ag.add_argument("--frequency", type=_int, help="on-CPU samples per second per CPU")
    ag.set_defaults(func=cmd_agent)

    co = sub.add_parser("collector", help="receive, store and serve profiles",
                        description="Receive WriteRaw over gRPC, store in SQLite, "
                                    "answer queries over HTTP.")
    co.add_argument("--config", help="YAML config file (see config/ember.yaml)")
    co.add_argument("--grpc-listen", help="HOST:PORT for gRPC WriteRaw")
    co.add_argument("--http-listen", help="HOST:PORT for the HTTP query API")
    co.add_argument("--storage", help="SQLite database file")
    co.add_argument("--allow-public", action="store_true",
                    help="listen beyond loopback without a token")
    co.set_defaults(func=cmd_collector)

    qu = sub.add_parser("query", help="fetch a merged profile from a collector")
    qu.add_argument("--collector", required=True, help="collector HTTP URL, e.g. "
                    "http://127.0.0.1:7072")
    qu.add_argument("--since", default="1h", help="how far back (default 1h)")
    qu.add_argument("--match", action="append", default=[], metavar="LABEL=VALUE",
                    help="label matcher (repeatable)")
    qu.add_argument("--type", default="cpu", help="cpu, offcpu, or a stored type name")
    qu.add_argument("--format", choices=("folded", "pprof", "json"), default="folded")
    qu.add_argument("--output", "-o", default=None)
    qu.add_argument("--token-file", help="file with the collector's bearer token")
    qu.add_argument("--ca", help="CA certificate (PEM) for an https collector")
    qu.set_defaults(func=cmd_query)

    fg = sub.add_parser("flamegraph", help="render folded stacks or pprof as an interactive SVG",
                        description="Render a flame graph: INPUT is folded stacks, a pprof "
                                    "file, - (stdin), or a collector query URL.")
    fg.add_argument("input")
    fg.add_argument("--output", "-o", help="OUT.svg or OUT.html (default: SVG on stdout)")
    fg.add_argument("--title")
    fg.add_argument("--countname", default="samples",
                    help="what folded counts are; ns, us, ms or s mean time (default samples)")
    fg.add_argument("--palette", choices=("auto", "hot", "io"), default="auto")
    fg.add_argument("--inverted", action="store_true", help="icicle layout: root at the top")
    fg.add_argument("--width", type=_int, default=1200)
    fg.add_argument("--cold", metavar="OFFCPU_INPUT",
                    help="hot/cold: add this off-CPU profile; widths in time")
    fg.add_argument("--frequency", type=_int,
                    help="hot/cold with folded on-CPU input: its sampling frequency")
    fg.set_defaults(func=cmd_flamegraph)

    df = sub.add_parser("diff", help="red/blue differential flame graph of two profiles",
                        description="Shapes from AFTER; red where a frame grew, blue where it "
                                    "shrank, intensity by the size of the change.")
    df.add_argument("before")
    df.add_argument("after")
    df.add_argument("--output", "-o", help="OUT.svg or OUT.html (default: SVG on stdout)")
    df.add_argument("--folded", help="also write the two-column diff 'stack before after'")
    df.add_argument("--normalize", action="store_true", help="scale BEFORE to AFTER's total")
    df.add_argument("--strip-hex", action="store_true",
                    help="ignore raw addresses (0x...) so unknown frames compare")
    df.add_argument("--negate", action="store_true",
                    help="shapes from BEFORE, to show what vanished")
    df.add_argument("--title")
    df.add_argument("--countname", default="samples")
    df.add_argument("--width", type=_int, default=1200)
    df.set_defaults(func=cmd_diff)

    sy = sub.add_parser("symbolize", help="name addresses of a live process",
                        description="Print 'ADDR FUNCTION+OFFSET OBJECT' for each address "
                                    "(hex), from the arguments or one per line on stdin. "
                                    "Kernel addresses are named from /proc/kallsyms.")
    sy.add_argument("--pid", type=_int, required=True)
    sy.add_argument("addresses", nargs="*", metavar="ADDR")
    sy.add_argument("--debug-dir", action="append", default=None,
                    help="where separate debug files live (default /usr/lib/debug; repeatable)")
    sy.add_argument("--lines", action="store_true",
                    help="after each address, its source lines from DWARF, innermost "
                         "(inlined) function first, one indented line each")
    sy.set_defaults(func=cmd_symbolize)

    ref = sub.add_parser("config-reference", help="print the configuration reference")
    ref.set_defaults(func=cmd_config_reference)
    mref = sub.add_parser("metrics-reference", help="print the metrics reference")
    mref.set_defaults(func=cmd_metrics_reference)
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
    from ..encode.folded import encode_folded
    from ..encode.pprof import encode_pprof
    from ..record import Recorder, RecordOptions
    from ..symbols.debuginfo import DEFAULT_DEBUG_DIRS

    options = RecordOptions(
        mode=args.mode, pids=tuple(args.pid), duration=args.duration, frequency=args.frequency,
        kernel_stacks=args.kernel_stacks, user_stacks=args.user_stacks,
        min_block_us=args.min_block_us, max_block_us=args.max_block_us, state=args.state,
        sample_us=args.sample_us, sys_exit_hook=args.sys_exit_hook,
        include_self=args.include_self, lines=args.lines,
        debug_dirs=tuple(args.debug_dir) if args.debug_dir else DEFAULT_DEBUG_DIRS,
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
    unit = "samples" if options.mode == "cpu" else "events"
    print(f"ember record: {s.drain.events} {unit}, {len(profile.samples)} stacks, "
          f"{s.drains} drains"
          + (f"; truncated stacks: {s.drain.stacks_truncated}" if s.drain.stacks_truncated else "")
          + (f"; dropped: {lost}" if lost else ""), file=sys.stderr)
    return 0


def _events() -> tuple[threading.Event, threading.Event]:
    """SIGTERM/SIGINT set stop; SIGHUP sets reload."""
    stop, reload = threading.Event(), threading.Event()

    def on_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping (%s)", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGHUP, lambda *_: reload.set())
    return stop, reload


def cmd_agent(args: argparse.Namespace) -> int:
    from .. import config
    from ..agent.controller import Agent

    cfg = config.load(args.config)
    targets = cfg.agent.targets
    if args.pid:
        for pid in args.pid:
            if pid <= 0 or not Path(f"/proc/{pid}").is_dir():
                raise UsageError(f"no process with PID {pid}")
        targets = config.override(targets, pids=tuple(args.pid))
    try:
        agent_cfg = config.override(
            cfg.agent, targets=targets,
            collector=config.parse_hostport(args.collector) if args.collector else None,
            interval=config.parse_duration(args.interval) if args.interval else None,
            metrics_listen=(config.parse_hostport(args.metrics_listen)
                            if args.metrics_listen else None),
            spool_dir=args.spool_dir, frequency=args.frequency)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not 1 <= agent_cfg.interval <= 3600:
        raise UsageError(f"--interval must be between 1s and 1h, not {args.interval}")
    stop, reload = _events()
    agent = Agent(agent_cfg, config_path=args.config)
    agent.run(stop, reload)
    return 0


def cmd_collector(args: argparse.Namespace) -> int:
    from .. import config
    from ..collector.server import Collector

    cfg = config.load(args.config)
    try:
        co = config.override(
            cfg.collector,
            grpc_listen=config.parse_hostport(args.grpc_listen) if args.grpc_listen else None,
            http_listen=config.parse_hostport(args.http_listen) if args.http_listen else None,
            storage=args.storage)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    stop, _reload = _events()
    collector = Collector(co, allow_public=args.allow_public)
    collector.start()
    print(f"ember collector: gRPC {co.grpc_listen}, HTTP http://{co.http_listen}, "
          f"storage {co.storage}", file=sys.stderr, flush=True)
    collector.wait(stop)
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    import ssl
    import urllib.error
    import urllib.parse
    import urllib.request

    params = [("since", args.since), ("type", args.type), ("format", args.format)]
    params += [("match", m) for m in args.match]
    for m in args.match:
        if "=" not in m:
            raise UsageError(f"--match must be LABEL=VALUE, not {m!r}")
    url = f"{args.collector.rstrip('/')}/api/v1/profile?{urllib.parse.urlencode(params)}"
    from ..config import read_token

    headers = {}
    if args.token_file:
        headers["Authorization"] = f"Bearer {read_token(args.token_file)}"
    context = ssl.create_default_context(cafile=args.ca) if args.ca else None
    if args.output:
        _check_output(args.output)
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=60, context=context) as resp:
            data = resp.read()
    except urllib.error.HTTPError as exc:
        try:
            msg = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            msg = exc.reason
        raise EmberError(f"collector answered {exc.code}: {msg}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise EmberError(f"cannot reach {args.collector}: {getattr(exc, 'reason', exc)}") \
            from None
    _write(args.output, data)
    return 0


def _write_graph(path: str | None, svg_text: str, title: str) -> None:
    from ..flamegraph.svg import to_html

    if path is not None:
        _check_output(path)
    data = to_html(svg_text, title) if path and path.endswith((".html", ".htm")) else svg_text
    _write(path, data.encode())


def cmd_flamegraph(args: argparse.Namespace) -> int:
    from ..flamegraph.graphs import flamegraph

    if args.width < 100:
        raise UsageError("--width must be at least 100")
    text = flamegraph(args.input, args.title, args.countname, args.palette, args.inverted,
                      args.width, args.cold, args.frequency)
    _write_graph(args.output, text, args.title or "ember flame graph")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from ..flamegraph.graphs import diff

    if args.folded:
        _check_output(args.folded)
    text, two_column = diff(args.before, args.after, args.normalize, args.strip_hex,
                            args.negate, args.title, args.countname, args.width)
    _write_graph(args.output, text, args.title or "ember differential flame graph")
    if args.folded:
        _write(args.folded, two_column.encode())
    return 0


def cmd_symbolize(args: argparse.Namespace) -> int:
    from ..errors import SymbolizationError
    from ..model import KERNEL_MAPPING
    from ..symbols.debuginfo import DEFAULT_DEBUG_DIRS
    from ..symbols.demangle import demangle
    from ..symbols.kallsyms import KernelSymbols
    from ..symbols.objects import ObjectCache
    from ..symbols.procmaps import ProcessTable
    from ..symbols.symbolizer import Symbolizer

    table = ProcessTable()
    proc = table.get(args.pid)
    if proc is None:
        raise UsageError(f"no process with PID {args.pid} (or its maps are not readable)")
    sym = Symbolizer(table, objects=ObjectCache(debug_dirs=args.debug_dir or DEFAULT_DEBUG_DIRS))
    kernel: KernelSymbols | None = None
    words = args.addresses or sys.stdin.read().split()
    out = []
    for word in words:
        try:
            addr = int(word, 16)
        except ValueError:
            raise UsageError(f"not a hex address: {word!r}") from None
        if addr >= KERNEL_MAPPING.start:
            if kernel is None:
                try:
                    kernel = KernelSymbols()
                except SymbolizationError as exc:
                    raise EmberError(str(exc)) from None
            hit = kernel.lookup(addr)
            out.append(f"{addr:#x} {hit[0]}+{hit[1]:#x} [kernel.kallsyms]" if hit
                       else f"{addr:#x} [unknown] [kernel.kallsyms]")
            continue
        entry = proc.find(addr)
        if entry is None:
            out.append(f"{addr:#x} [unknown] [unmapped]")
            continue
        named = sym.lookup(args.pid, entry, addr) if entry.file_backed else None
        if named is None:
            frame = sym.user_frames(args.pid, [addr])[0]
            out.append(f"{addr:#x} {frame.name} {entry.path or '[anon]'}")
        else:
            out.append(f"{addr:#x} {named[0]}+{named[2]:#x} {entry.path}")
            if args.lines:
                chain = sym.source_lines(args.pid, entry, addr)
                for i, sl in enumerate(chain):
                    name = demangle(sl.function) if sl.function else named[0]
                    inlined = " (inlined)" if i < len(chain) - 1 else ""
                    out.append(f"  {name} {sl.file or '??'}:{sl.line}{inlined}")
    sys.stdout.write("".join(line + "\n" for line in out))
    return 0


def cmd_metrics_reference(_args: argparse.Namespace) -> int:
    from ..metrics import reference

    sys.stdout.write(reference())
    return 0


def cmd_config_reference(args: argparse.Namespace) -> int:
    from ..config import reference

    sys.stdout.write(reference())
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
