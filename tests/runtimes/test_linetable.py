"""ember.runtimes.linetable against the real interpreters on this machine.

Each interpreter (Debian's 3.11 and the pyenv 3.10-3.13 builds) compiles a
dozen big stdlib modules of its own plus generated source full of awkward
constructs, and reports for every code object its raw ``co_linetable``,
``co_firstlineno``, ``co_lines()`` and what ``PyCode_Addr2Line`` (through
ctypes) answers at each range's first and last byte. The decoder, running in
this process, must reproduce all of it from the raw bytes alone. The same is
done for random well-formed tables fed to ``code.replace``, which reach corners
compiled code never does (negative lines, a computed line of -1, long runs of
3.10 zero-length pairs). Garbage and truncated tables must end in a result or
a ValueError, quickly.
"""

from __future__ import annotations

import functools
import json
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest

from ember.runtimes.linetable import (
    SUPPORTED_VERSIONS,
    LineRange,
    find_line,
    line_at,
    line_ranges,
)
from tests.support.pythons import pyenv_root

Version = tuple[int, int]

# (test id, pyenv version or None for a fixed path, executable, Python version)
_INTERPRETERS: list[tuple[str, str | None, str, Version]] = [
    ("debian-3.11", None, "/usr/bin/python3.11", (3, 11)),
    ("pyenv-3.10.13", "3.10.13", "python3.10", (3, 10)),
    ("pyenv-3.11.7", "3.11.7", "python3.11", (3, 11)),
    ("pyenv-3.12.1", "3.12.1", "python3.12", (3, 12)),
    ("pyenv-3.13.0", "3.13.0", "python3.13", (3, 13)),
]

# Big stdlib modules (a trailing slash: every .py of that package), relative
# to the interpreter's own stdlib directory.
_STDLIB = [
    "typing.py", "ast.py", "argparse.py", "inspect.py", "dataclasses.py", "enum.py",
    "functools.py", "pydoc.py", "tarfile.py", "_pydecimal.py", "subprocess.py",
    "collections/__init__.py", "asyncio/", "email/", "json/", "unittest/",
]


def _executable(pyenv_version: str | None, name: str) -> Path:
    if pyenv_version is None:
        return Path(name)
    return pyenv_root() / "versions" / pyenv_version / "bin" / name


_PARAMS = [pytest.param(_executable(pv, exe), version, id=tid)
           for tid, pv, exe, version in _INTERPRETERS]


def _require(executable: Path) -> None:
    if not executable.exists():
        pytest.skip(f"{executable} is not installed")


# ---------------------------------------------------------------------------
# What runs inside each interpreter (3.10 syntax: no newer constructs here).

_DUMP_SCRIPT = r'''
import ctypes, glob, json, os, sys, sysconfig

req = json.load(sys.stdin)
addr2line = ctypes.pythonapi.PyCode_Addr2Line
addr2line.argtypes = (ctypes.py_object, ctypes.c_int)
addr2line.restype = ctypes.c_int

def walk(co):
    yield co
    for const in co.co_consts:
        if isinstance(const, type(co)):
            yield from walk(const)

def record(co, label):
    lines = list(co.co_lines())
    probes = [-2, len(co.co_code)]
    for start, end, _ in lines:
        probes += [start, end - 1]
    return [label, co.co_linetable.hex(), co.co_firstlineno, lines,
            [[p, addr2line(co, p)] for p in probes]]

out = []
stdlib = sysconfig.get_paths()["stdlib"]
for name in req["stdlib"]:
    path = os.path.join(stdlib, name)
    paths = sorted(glob.glob(os.path.join(path, "*.py"))) if name.endswith("/") else [path]
    for p in paths:
        with open(p, "rb") as fh:
            top = compile(fh.read(), p, "exec", dont_inherit=True)
        for co in walk(top):
            out.append(record(co, "%s:%s:%d" % (os.path.relpath(p, stdlib),
                                                  co.co_name, co.co_firstlineno)))
for name, minimum, text in req["sources"]:
    if tuple(sys.version_info[:2]) >= tuple(minimum):
        for co in walk(compile(text, name, "exec", dont_inherit=True)):
            out.append(record(co, "%s:%s:%d" % (name, co.co_name, co.co_firstlineno)))
base = compile("pass", "<synthetic>", "exec")
for i, (table, firstlineno) in enumerate(req["synthetic"]):
    co = base.replace(co_linetable=bytes.fromhex(table), co_firstlineno=firstlineno)
    out.append(record(co, "synthetic#%d" % i))
json.dump({"version": list(sys.version_info[:2]), "codes": out}, sys.stdout)
'''

# label, hex co_linetable, co_firstlineno, co_lines(), [[offset, PyCode_Addr2Line]]
Record = tuple[str, str, int, list[LineRange], list[tuple[int, int]]]


def _run(executable: Path, request: dict[str, Any]) -> tuple[Version, list[Record]]:
    proc = subprocess.run([str(executable), "-I", "-c", _DUMP_SCRIPT], input=json.dumps(request),
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    records: list[Record] = [
        (label, table, first, [(s, e, ln) for s, e, ln in lines], [(p, r) for p, r in probes])
        for label, table, first, lines, probes in data["codes"]]
    return (data["version"][0], data["version"][1]), records


@functools.cache
def _compiled(executable: Path) -> tuple[Version, list[Record]]:
    """Every code object of the stdlib modules and the tricky sources, as
    ``executable`` compiles them (cached: several tests read it)."""
    return _run(executable, {"stdlib": _STDLIB, "sources": _sources(), "synthetic": []})


# ---------------------------------------------------------------------------
# Source text with the constructs that stress line tables.

_HANDWRITTEN = '''\
import functools


def deco(arg):
    def wrap(fn):
        return fn
    return wrap


@deco(
    lambda x: (x
               + 1),
)
@functools.lru_cache(maxsize=None)
def decorated(a, b=lambda: [i * j for i in range(3) for j in range(i) if i
                            != j]):
    squares = {k: k * k for k in range(a)}
    evens = {k for k in squares if k % 2 == 0}
    gen = (v for v in evens
           if v)
    return sum(gen) + len(squares) + (lambda *a, **k: len(a))(1, 2, x=3)


class Klass:
    attr = [n for n in range(3)]

    @property
    def prop(self):
        return (
            self.attr
        )

    @staticmethod
    def stat(x):
        try:
            y = 1 / x
        except ZeroDivisionError as exc:
            y = exc
        except (TypeError,
                ValueError):
            raise
        else:
            y = y * 2
        finally:
            x = None
        return y


def loops(n):
    total = 0
    for i in range(n):
        if i % 3 == 0:
            continue
        elif i % 5 == 0:
            break
        total += i
    else:
        total = -1
    while (total
           > 0):
        total -= 7
    with open(__file__) as fh, \\
            open(__file__) as fh2:
        data = fh.read() + fh2.read()
    return total, data


async def coroutine(items):
    async with items as cm:
        async for item in cm:
            await item
    return [x async for x in items]


def generator(n):
    yield 1
    yield from range(n)
    received = yield
    return received


def closures():
    counter = 0

    def inc():
        nonlocal counter
        counter += 1
        return counter
    return inc


def backwards(f, g):
    # a call's own instructions sit on the line where the call starts, after
    # its arguments on later lines: the line numbers go backwards
    return f(
        g(1),
        g(2),
    ) + f(
        [g(3),
         g(4)],
    )


def expressions(x, y):
    z = (x
         if y else
         -x)
    assert x, (
        "message")
    del z
    first, *rest = [x,
                    y]
    if (n := len(rest)) > 1:
        return n
    return f"{x!r:>10}" f"{y}" \\
        f"{first}"


def matcher(cmd):
    match cmd:
        case ["go", direction] if direction in ("n", "s"):
            return direction
        case {"x": x, **rest}:
            return x, rest
        case Klass(attr=[1, *others]):
            return others
        case str() | bytes() as text:
            return text
        case _:
            return None
'''

_EXCEPT_STAR = '''\
def groups():
    try:
        raise ExceptionGroup("g", [ValueError(1), TypeError(2)])
    except* ValueError as eg:
        caught = eg
    except* TypeError:
        pass
    return caught
'''

_PEP695 = '''\
type Alias = list[int]


def ident[T](x: T) -> T:
    return x


class Box[T]:
    def get(self) -> T:
        return self.item
'''


def _generated() -> str:
    out: list[str] = []
    # one line worth far more than 256 code units (and columns past 127)
    out.append("def long_line(a):\n    return " + " + ".join(f"a[{i}]" for i in range(300)))
    out.append("def long_calls(f):\n    return [" + ", ".join(f"f({i})" for i in range(200)) + "]")
    # more than 256 locals (EXTENDED_ARG), and a long function
    body = "".join(f"    v{i} = v{i - 1} * {i} if {i} % 7 else v{i - 1} - {i}\n"
                   for i in range(1, 600))
    out.append("def many_locals(v0):\n" + body + "    return v599")
    # forward line jumps beyond what one 3.10 pair or short entry holds
    out.append("def gaps():\n    a = 1\n" + "    # gap\n" * 300 + "    b = 2\n" + "\n" * 5000
               + "    return a + b")
    # backward jumps beyond 127 lines: the call comes back to its first line
    out.append("def back_gap(f, g):\n    return f(\n" + "        # gap\n" * 300
               + "        g(1),\n    ) + g(\n" + "\n" * 1000 + "        2)")
    out.append("x = (\n" + "    # gap\n" * 200 + "    1)\nclass C:\n    y = (\n" + "\n" * 150
               + "        2)")
    # a function far down a big file
    out.append("\n" * 70000 + "def far_away(x):\n    return x + 1")
    return "\n\n\n".join(out) + "\n"


@functools.cache
def _sources() -> list[tuple[str, Version, str]]:
    return [("handwritten.py", (3, 10), _HANDWRITTEN), ("generated.py", (3, 10), _generated()),
            ("except_star.py", (3, 11), _EXCEPT_STAR), ("pep695.py", (3, 12), _PEP695)]


# ---------------------------------------------------------------------------
# Real interpreters


def _expected_addr2line(version: Version, raw: int) -> int | None:
    """What line_at must answer where PyCode_Addr2Line answered ``raw``. -1 is
    "no line". Up to 3.11 co_lines() shows every negative line as None while
    PyCode_Addr2Line returns it as is; line_at follows co_lines() there (only
    hand-made tables have negative lines besides -1)."""
    if raw == -1 or (version <= (3, 11) and raw < 0):
        return None
    return raw


_LINE_AT_SAMPLE = 16


def _check_records(version: Version, records: list[Record]) -> None:
    mismatches: list[str] = []
    for label, table_hex, first, lines, probes in records:
        table = bytes.fromhex(table_hex)
        got = line_ranges(version, table, first)
        if got != lines:
            mismatches.append(f"{label}: co_lines {lines[:8]}... decoded {got[:8]}...")
            continue
        # line_at decodes the whole table on every call, so on the few huge
        # tables (module bodies) it samples up to _LINE_AT_SAMPLE ranges;
        # find_line, which line_at ends in, sees every range there too
        stride = -(-len(lines) // _LINE_AT_SAMPLE)
        for i, (start, end, line) in enumerate(lines):
            for offset in (start, end - 1):
                at = line_at(version, table, first, offset) if i % stride == 0 else line
                if at != line or find_line(got, offset) != line:
                    mismatches.append(f"{label}: offset {offset}: line_at {at}, co_lines {line}")
        for offset, raw in probes:
            at = find_line(got, offset) if offset >= 0 else line_at(version, table, first, offset)
            if at != _expected_addr2line(version, raw):
                mismatches.append(f"{label}: offset {offset}: line_at {at}, "
                                  f"PyCode_Addr2Line {raw}")
    assert not mismatches, f"{len(mismatches)} mismatches:\n" + "\n".join(mismatches[:20])


@pytest.mark.slow
@pytest.mark.parametrize(("executable", "version"), _PARAMS)
def test_compiled_code_matches_interpreter(executable: Path, version: Version) -> None:
    _require(executable)
    reported, records = _compiled(executable)
    assert reported == version
    _check_records(version, records)

    # the corpus really holds what the tricky source is there for
    assert len(records) > 3000
    assert any(r[0].startswith("generated.py:far_away") and r[2] > 70000 for r in records)
    jumps = [b[2] - a[2] for r in records for a, b in zip(r[3], r[3][1:], strict=False)
             if a[2] is not None and b[2] is not None]
    assert max(jumps) > 127 and min(jumps) < -127
    longest = 0  # bytes of code one line covers without a break
    for r in records:
        run_line, run_start = None, 0
        for start, end, line in r[3]:
            if line != run_line:
                run_line, run_start = line, start
            if line is not None:
                longest = max(longest, end - run_start)
    assert longest > 512
    assert any(line is None for r in records for _, _, line in r[3]) or version == (3, 10)
    print(f"\n{executable} ({version[0]}.{version[1]}): {len(records)} code objects, "
          f"{sum(len(r[3]) for r in records)} ranges")


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 64:
        out.append(64 | (value & 63))
        value >>= 6
    out.append(value)
    return bytes(out)


def _svarint(value: int) -> bytes:
    return _varint((-value << 1) | 1 if value < 0 else value << 1)


def _line_delta(rnd: random.Random) -> int:
    return rnd.choice([0, 0, 1, -1, 2, -2, 3, -3, rnd.randint(-300, 300),
                       rnd.randint(-100000, 100000)])


def _random_pep657(rnd: random.Random) -> bytes:
    """A well-formed location table, in the shapes the compiler writes."""
    out = bytearray()
    for _ in range(rnd.randint(0, 40)):
        code = rnd.choice([*range(10), 10, 11, 12, 13, 13, 14, 14, 15, 15])
        out.append(0x80 | code << 3 | rnd.randrange(8))
        if code < 10:
            out.append(rnd.randrange(128))
        elif code < 13:
            out += bytes([rnd.randrange(128), rnd.randrange(128)])
        elif code == 13:
            out += _svarint(_line_delta(rnd))
        elif code == 14:
            out += _svarint(_line_delta(rnd)) + _varint(rnd.randrange(4)) \
                + _varint(rnd.randrange(300)) + _varint(rnd.randrange(300))
    return bytes(out)


def _random_pep626(rnd: random.Random) -> bytes:
    """A well-formed 3.10 table: any pairs, the last one not zero-length."""
    out = bytearray()
    for _ in range(rnd.randint(0, 40)):
        out.append(rnd.choice([0, 0, 2, 4, 254, rnd.randrange(256)]))
        out.append(rnd.choice([0x80, 0, 1, 0xFF, 127, 0x81, rnd.randrange(256)]))
    if out and out[-2] == 0:
        out += bytes([rnd.choice([1, 2, 6]), rnd.randrange(256)])
    return bytes(out)


@pytest.mark.slow
@pytest.mark.parametrize(("executable", "version"), _PARAMS)
def test_synthetic_tables_match_interpreter(executable: Path, version: Version) -> None:
    """Hand-made tables reach what compiled code does not: negative lines, a
    computed -1 next to "no location", 3.10 zero-length runs and -128."""
    _require(executable)
    rnd = random.Random(f"synthetic-{version}")
    make = _random_pep626 if version == (3, 10) else _random_pep657
    synthetic = [(make(rnd).hex(), rnd.choice([0, 1, 2, 3, 5, 200, rnd.randrange(1, 10**6)]))
                 for _ in range(3000)]
    reported, records = _run(executable, {"stdlib": [], "sources": [], "synthetic": synthetic})
    assert reported == version
    assert len(records) == len(synthetic)
    _check_records(version, records)


# ---------------------------------------------------------------------------
# Garbage


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Turns an endless loop into a failure instead of a hung test run."""
    def expired(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"still decoding after {seconds}s")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _own_tables() -> list[bytes]:
    """Real tables from this very interpreter (3.11+: the same format as 3.11
    to 3.13 read)."""
    assert sys.version_info[:2] >= (3, 11)
    import argparse

    def walk(co: CodeType) -> Iterator[CodeType]:
        yield co
        for const in co.co_consts:
            if isinstance(const, CodeType):
                yield from walk(const)

    with open(argparse.__file__, "rb") as fh:
        return [co.co_linetable for co in walk(compile(fh.read(), argparse.__file__, "exec"))]


def _decode_or_value_error(version: Version, table: bytes, offset: int) -> None:
    try:
        ranges = line_ranges(version, table, 1)
    except ValueError as exc:
        assert str(exc)
        return
    # whatever comes back is usable for bisection: contiguous, non-empty ranges from 0
    end = 0
    for start, stop, line in ranges:
        assert start == end < stop and (line is None or isinstance(line, int))
        end = stop
    assert line_at(version, table, 1, offset) == (1 if offset < 0 else find_line(ranges, offset))


def test_garbage_and_truncations_end_quickly() -> None:
    rnd = random.Random("garbage")
    real: dict[Version, list[bytes]] = {v: _own_tables() for v in SUPPORTED_VERSIONS[1:]}
    real[(3, 10)] = [_random_pep626(rnd) for _ in range(200)]
    pep626 = _executable("3.10.13", "python3.10")
    if pep626.exists():
        real[(3, 10)] += [bytes.fromhex(r[1]) for r in _compiled(pep626)[1][:300]]
    inputs: list[tuple[Version, bytes]] = []
    for version in SUPPORTED_VERSIONS:
        for _ in range(1500):
            junk = bytearray(rnd.randbytes(rnd.randrange(300)))
            if junk and rnd.random() < 0.5:
                junk[0] |= 0x80
            inputs.append((version, bytes(junk)))
        for table in rnd.sample(real[version], min(60, len(real[version]))):
            inputs += [(version, table[:cut]) for cut in range(len(table))]
            for _ in range(5):
                flipped = bytearray(table)
                if flipped:
                    flipped[rnd.randrange(len(flipped))] ^= 1 << rnd.randrange(8)
                inputs.append((version, bytes(flipped)))
        inputs.append((version, rnd.randbytes(1 << 18)))
        inputs.append((version, bytes([0xC0] * (1 << 16))))  # one endless varint
        inputs.append((version, bytes([0x80, 0x00] * (1 << 16))))  # 3.10: zero-length run
    began = time.monotonic()
    slowest = 0.0
    with _deadline(120):
        for version, table in inputs:
            t0 = time.monotonic()
            _decode_or_value_error(version, table, rnd.randrange(-4, 2 * len(table) + 4))
            slowest = max(slowest, time.monotonic() - t0)
    assert slowest < 2.0
    assert time.monotonic() - began < 60


# ---------------------------------------------------------------------------
# Hand-checked examples and the errors' wording


def test_pep626_examples() -> None:
    # 6 bytes on line 10 (+0), a zero-length +127 then 2 bytes at +130, 4 bytes
    # with no line, 2 bytes at line 139 (-128 left the line alone)
    table = bytes([6, 0, 0, 127, 2, 3, 4, 0x80, 2, 2])
    assert line_ranges((3, 10), table, 10) == [(0, 6, 10), (6, 8, 140), (8, 12, None),
                                               (12, 14, 142)]
    assert line_at((3, 10), table, 10, 7) == 140
    assert line_at((3, 10), table, 10, 9) is None
    assert line_at((3, 10), table, 10, 14) is None
    assert line_at((3, 10), table, 10, -2) == 10  # before the first instruction
    # 3.10 does not merge, and any negative line reads as None
    assert line_ranges((3, 10), bytes([2, 0, 2, 0, 2, 0xFE]), 1) == [(0, 2, 1), (2, 4, 1),
                                                                    (4, 6, None)]
    assert line_ranges((3, 10), b"", 5) == []


def test_pep657_examples() -> None:
    table = bytes([
        0x80 | 15 << 3 | 0,              # 1 unit, no location
        0x80 | 13 << 3 | 0, _svarint(1)[0],  # 1 unit, no columns, +1
        0x80 | 2 << 3 | 7, 0x12,         # 8 units, short form, same line
        0x80 | 11 << 3 | 1, 4, 9,        # 2 units, one-line form, +1
        0x80 | 14 << 3 | 0, *_svarint(-300), 0, 1, 5,  # 1 unit, long form, -300
        0x80 | 15 << 3 | 2,              # 3 units, no location
        0x80 | 10 << 3 | 0, 1, 2,        # 1 unit, one-line form, +0
    ])
    assert line_ranges((3, 11), table, 400) == [
        (0, 2, None), (2, 4, 401), (4, 20, 401), (20, 24, 402), (24, 26, 102), (26, 32, None),
        (32, 34, 102)]
    merged = [(0, 2, None), (2, 20, 401), (20, 24, 402), (24, 26, 102), (26, 32, None),
              (32, 34, 102)]
    assert line_ranges((3, 12), table, 400) == merged
    assert line_ranges((3, 13), table, 400) == merged
    assert line_at((3, 12), table, 400, 19) == 401
    assert line_at((3, 12), table, 400, 27) is None
    assert line_at((3, 12), table, 400, 34) is None
    # a computed line of -1 is "no line" and merges with one in 3.12+; -2 is a line
    neg = bytes([0x80 | 13 << 3, _svarint(-2)[0], 0x80 | 15 << 3, 0x80 | 13 << 3,
                 _svarint(0)[0]])
    assert line_ranges((3, 12), neg, 1) == [(0, 6, None)]
    assert line_ranges((3, 12), neg, 0) == [(0, 2, -2), (2, 4, None), (4, 6, -2)]
    assert line_ranges((3, 11), neg, 0) == [(0, 2, None), (2, 4, None), (4, 6, None)]


@pytest.mark.parametrize(("version", "table", "message"), [
    ((3, 10), bytes([2, 0, 4]), "odd length 3"),
    ((3, 10), bytes([2, 0, 0, 5]), "ends with zero-length pairs"),
    ((3, 11), bytes([0x05, 0x80]), "starts with byte 0x05"),
    ((3, 12), bytes([0x80 | 13 << 3]), "runs into the table's end"),
    ((3, 12), bytes([0x80 | 14 << 3, 0x40, 0x80]), "runs into the next entry"),
    ((3, 13), bytes([0x80 | 13 << 3, *[0x7F] * 6, 0x01]), "longer than an unsigned int"),
    ((3, 13), bytes([0x80 | 13 << 3, *[0x7F] * 5, 0x3F]), "overflows an unsigned int"),
    ((3, 13), bytes([0x80 | 13 << 3, *_svarint(2**31 - 1)]), "does not fit a C int"),
    ((3, 9), b"", "unsupported Python version (3, 9)"),
    ((3, 14), b"", "unsupported Python version (3, 14)"),
])
def test_errors(version: Version, table: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        line_ranges(version, table, 5)
    with pytest.raises(ValueError):
        line_at(version, table, 5, 0)


def test_firstlineno_must_fit_a_c_int() -> None:
    with pytest.raises(ValueError, match="does not fit a C int"):
        line_ranges((3, 12), b"", 2**31)
