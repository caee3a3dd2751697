"""Durations, sizes and addresses as people write them ('500ms', '256MiB',
':7070') and back: the config file, the command-line flags and the reference
all speak the same units, so parsing and rendering live together."""

from __future__ import annotations

import math
import re

# ASCII digits only: \d and int() also take other scripts' digits ('٣s').
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(us|ms|s|m|h|d)\s*$")
_DURATION_UNITS = {"us": 1e-6, "ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE = re.compile(r"^\s*([0-9]{1,30})\s*(B|KiB|MiB|GiB|TiB)?\s*$")
_PORT = re.compile(r"[0-9]{1,5}")
_HOST_FORBIDDEN = re.compile(r"[\s\x00-\x1f\x7f]")
_SIZE_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def parse_duration(text: str | int | float) -> float:
    """'10s', '500ms', '1us', '2m', '1h', '7d' -> seconds; a bare number is seconds.
    Always finite: NaN passes any range check, and neither converts to an int."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text) if abs(text) < 1e300 else math.inf  # float(10**400) raises
    else:
        m = _DURATION.match(str(text))
        if not m:
            raise ValueError(f"not a duration: {text!r} "
                             "(use e.g. 50us, 500ms, 10s, 5m, 1h, 7d)")
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    if not math.isfinite(seconds):
        raise ValueError(f"not a finite duration: {text!r}")
    return seconds


def parse_size(text: str | int) -> int:
    """'256MiB', '1GiB', '4096' -> bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 4096, 64KiB, 256MiB, 1GiB)")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)]


def parse_hostport(text: str) -> str:
    """'host:port' as given; an empty host means every address (0.0.0.0)."""
    host, sep, port = str(text).rpartition(":")
    if (not sep or not _PORT.fullmatch(port) or not 0 < int(port) < 65536
            or _HOST_FORBIDDEN.search(host)):
        raise ValueError(f"not HOST:PORT: {text!r}")
    return f"{host or '0.0.0.0'}:{port}"


def render_duration(seconds: float) -> str:
    """Seconds in the largest unit below a second that keeps them whole-ish."""
    if 0 < seconds < 0.001:
        return f"{seconds * 1e6:g}us"
    if 0 < seconds < 1:
        return f"{seconds * 1e3:g}ms"
    return f"{seconds:g}s"


def render_size(size: int) -> str:
    """Bytes in the largest binary unit that divides them."""
    for unit in ("GiB", "MiB", "KiB"):
        if size % _SIZE_UNITS[unit] == 0 and size >= _SIZE_UNITS[unit]:
            return f"{size // _SIZE_UNITS[unit]}{unit}"
    return str(size)
