"""What the subcommands share: the shape of a command, argument types that
fail as one line, the collector access options of commands that read
collector URLs, the output path check and atomic write, and the signal
events that stop (and reload) long-running commands.

Kept free of heavy imports: every command module imports it to build the
parser, and ``ember --help`` must start fast."""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from ..errors import OutputError

log = logging.getLogger("ember")


@dataclass(frozen=True)
class Command:
    """One subcommand: how ``--help`` shows it, its arguments, and what it
    does. ``run`` returns the exit status; it raises ember's errors, which
    ``main`` turns into a message and a status."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None


def no_arguments(_parser: argparse.ArgumentParser) -> None:
    """For commands that take none."""


def int_arg(text: str) -> int:
    """An integer in any base Python reads (``0x1f``, ``0o7``, ``42``)."""
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    return value


_SECONDS = re.compile(r"^\s*-?[0-9]+(\.[0-9]+)?\s*$")


def duration_arg(text: str) -> float:
    """A duration as the config file writes it (``500ms``, ``10s``, ``2m``,
    ``1h``), or a bare number of seconds: seconds. The sign of a bare number
    is kept, for the command to say what range it wants."""
    from ..config.units import parse_duration  # its package reads YAML: not for --help

    try:
        return parse_duration(float(text) if _SECONDS.match(text) else text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_collector_access(p: argparse.ArgumentParser) -> None:
    """--token-file and --ca, for inputs that are collector URLs (the same
    options as ``ember query``)."""
    p.add_argument("--token-file", help="file with the collector's bearer token, sent when "
                   "an input is a collector URL")
    p.add_argument("--ca", help="CA certificate (PEM) for an https collector URL")


def collector_token(args: argparse.Namespace) -> str:
    """The bearer token of --token-file ('' without one); ConfigError when
    the file cannot be read."""
    from ..config import read_token

    return read_token(args.token_file or "")


def check_output(path: str | None) -> None:
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


def write(path: str | None, data: bytes) -> None:
    """Write the output: regular files atomically (temporary file + rename),
    so a reader never sees half a profile; devices and FIFOs in place;
    standard output when there is no path."""
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


def write_graph(path: str | None, svg_text: str, title: str) -> None:
    """A flame graph: an HTML page around the SVG when the path ends in
    .html or .htm, the SVG itself otherwise."""
    from ..flamegraph.svg import to_html

    if path is not None:
        check_output(path)
    data = to_html(svg_text, title) if path and path.endswith((".html", ".htm")) else svg_text
    write(path, data.encode())


def stop_event() -> threading.Event:
    """An event SIGINT and SIGTERM set, so a command can finish its work
    (detach, write the profile) instead of dying mid-way."""
    stop = threading.Event()

    def on_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping (%s)", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGTERM, on_stop)
    return stop


def stop_and_reload_events() -> tuple[threading.Event, threading.Event]:
    """For daemons: SIGINT/SIGTERM set stop; SIGHUP sets reload."""
    stop, reload = stop_event(), threading.Event()
    signal.signal(signal.SIGHUP, lambda *_: reload.set())
    return stop, reload


#: ``--max-input-size``'s default: flamegraph/inputs.py MAX_INPUT_SIZE, not
#: imported (the parser is built without the flame graph code); a test
#: keeps the two equal.
MAX_INPUT_SIZE = 1 << 30
_SHORT_UNIT = re.compile(r"^\s*(\d+)\s*([KMGT])\s*$")


def size_arg(text: str) -> int:
    """A size as the config file writes it (``512MiB``, ``1GiB``,
    ``4096``), or with a one-letter binary unit (``512M``)."""
    from ..config.units import parse_size  # its package reads YAML: not for --help

    short = _SHORT_UNIT.match(text)
    try:
        size = parse_size(f"{short[1]}{short[2]}iB" if short else text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0: {text!r}")
    return size


def add_max_input_size(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-input-size", type=size_arg, default=MAX_INPUT_SIZE, metavar="SIZE",
                   help="refuse an input of more folded text than this, or a gzip that "
                        "inflates past it (e.g. 512M, 2GiB; default 1GiB)")
