"""Compiling and loading ember's BPF programs, in a child process.

bcc compiles with the LLVM linked into libbcc. A compile takes about 160 MB,
and glibc keeps most of it after the compile: the agent would carry it for
its whole life. So ``build`` runs bcc in a short-lived child
(``python -m ember.kernel.build``), which compiles, creates the maps, loads the
programs and hands their file descriptors back over a Unix socket
(SCM_RIGHTS), then exits. The daemon never imports bcc; program.py attaches
and maps.py drains through the descriptors alone. Compiler and verifier
messages come back as the error text.

The protocol: the spec as JSON on the child's stdin; one message back with a
JSON header {"maps": {name: [fd index, max_entries]}, "progs": {label: fd
index}} and the descriptors.
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BpfError
from .programs import ProgramSpec, bpf_source_dir

_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


def flatten_source(name: str, directory: Path | None = None) -> str:
    """The program's text with ember's own ``#include "x.h"`` lines inlined.

    bcc rewrites map operations (``m.lookup(...)``) only in the main file; in
    an included header they compile to indirect calls the verifier rejects. So
    the loader inlines local headers, with ``#line`` markers so compiler
    messages still name the right file and line. System includes (<...>) are
    left to bcc. Each header is inlined once (include guards would drop
    repeats anyway).
    """
    directory = directory or bpf_source_dir()
    seen: set[str] = set()

    def expand(fname: str) -> list[str]:
        path = directory / fname
        if not path.is_file():
            raise BpfError(f"BPF source {path} not found")
        seen.add(fname)
        out = [f'#line 1 "{fname}"']
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            m = _LOCAL_INCLUDE.match(line)
            if not m:
                out.append(line)
                continue
            if m.group(1) not in seen:
                out.extend(expand(m.group(1)))
            out.append(f'#line {lineno + 1} "{fname}"')
        return out

    return "\n".join(expand(name)) + "\n"


@dataclass(frozen=True)
class Built:
    """What the child handed back: descriptors owned by this process."""

    maps: dict[str, tuple[int, int]]   # name -> (fd, max_entries)
    progs: dict[str, int]              # label -> prog fd (see ProgramSpec.functions)

    def close(self) -> None:
        for fd, _ in self.maps.values():
            _close(fd)
        for fd in self.progs.values():
            _close(fd)


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


_MAX_FDS = 64


def build(spec: ProgramSpec, strict: bool = False, timeout: float = 300) -> Built:
    """Compile and load spec in a child process; raise BpfError with the
    compiler's or verifier's messages if it fails."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ember.kernel.build", str(child.fileno())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            pass_fds=(child.fileno(),), env={**os.environ, "PYTHONPATH": _package_root()})
        child.close()
        request = json.dumps({"source": spec.source, "defines": spec.defines,
                              "functions": spec.functions, "tail_calls": spec.tail_calls,
                              "strict": strict})
        try:
            _, err = proc.communicate(request.encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise BpfError(f"compiling {spec.source} took over {timeout:.0f}s") from None
        parent.setblocking(False)
        try:
            msg, fds, _, _ = socket.recv_fds(parent, 1 << 16, _MAX_FDS)
        except BlockingIOError:
            msg, fds = b"", []
        if proc.returncode != 0 or not msg:
            for fd in fds:
                _close(fd)
            text = err.decode(errors="replace")
            raise BpfError(f"compiling {spec.source} failed:\n{_tail(text)}")
        header = json.loads(msg)
        return Built(maps={name: (fds[i], n) for name, (i, n) in header["maps"].items()},
                     progs={label: fds[i] for label, i in header["progs"].items()})
    finally:
        parent.close()
        child.close()


def _package_root() -> str:
    here = str(Path(__file__).resolve().parents[2])  # the directory holding ember/
    return os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)


_NOISE = re.compile(r"(warning: .*\[-W|ibt\.h|nocf_check|__noendbr|^\s*\^\s*$|generated\.$|"
                    r"In file included from|^\s*(extern|#define) )")


def _tail(text: str, lines: int = 30) -> str:
    """The compiler's messages without the kernel headers' own warnings."""
    kept = [line for line in text.splitlines() if line.strip() and not _NOISE.search(line)]
    return "\n".join(kept[-lines:]) or text[-4000:]


# --- the child -------------------------------------------------------------------

def _child(sock_fd: int) -> None:
    from bcc import BPF

    from .tp_btf import load_iter, load_tp_btf

    req = json.loads(sys.stdin.read())
    spec = ProgramSpec(req["source"], {k: int(v) for k, v in req["defines"].items()},
                       tuple((f, kind) for f, kind in req["functions"]),
                       tuple((a, label) for a, label in req.get("tail_calls", ())))
    b = BPF(text=flatten_source(spec.source).encode(), cflags=spec.cflags(bool(req["strict"])))
    lib: Any = ct.CDLL("libbcc.so.0")
    lib.bpf_num_tables.restype = ct.c_size_t
    lib.bpf_num_tables.argtypes = [ct.c_void_p]
    lib.bpf_table_name.restype = ct.c_char_p
    lib.bpf_table_name.argtypes = [ct.c_void_p, ct.c_size_t]
    lib.bpf_table_fd_id.restype = ct.c_int
    lib.bpf_table_fd_id.argtypes = [ct.c_void_p, ct.c_size_t]
    lib.bpf_table_max_entries_id.restype = ct.c_size_t
    lib.bpf_table_max_entries_id.argtypes = [ct.c_void_p, ct.c_size_t]
    fds: list[int] = []
    maps: dict[str, tuple[int, int]] = {}
    for i in range(lib.bpf_num_tables(b.module)):
        maps[lib.bpf_table_name(b.module, i).decode()] = (len(fds), lib.bpf_table_max_entries_id(
            b.module, i))
        fds.append(lib.bpf_table_fd_id(b.module, i))
    progs: dict[str, int] = {}
    for fn, kind in spec.functions:
        if kind == "perf_event":
            fd = b.load_func(fn.encode(), BPF.PERF_EVENT).fd
        elif kind == "tracepoint":
            fd = b.load_func(fn.encode(), BPF.TRACEPOINT).fd
        elif kind.startswith("tp_btf/"):
            fd = load_tp_btf(b, fn, kind.removeprefix("tp_btf/"))
        elif kind.startswith("iter/"):
            fd = load_iter(b, fn, kind.removeprefix("iter/"))
        else:
            raise BpfError(f"unknown program kind {kind!r} for {fn}")
        progs[f"{fn}@{kind}"] = len(fds)
        fds.append(fd)
    for array, label in spec.tail_calls:
        # a tail call's target: index 0 of its prog array
        b.get_table(array)[ct.c_int(0)] = ct.c_int(fds[progs[label]])
    if len(fds) > _MAX_FDS:
        raise BpfError(f"{spec.source}: {len(fds)} descriptors, at most {_MAX_FDS}")
    sock = socket.socket(fileno=sock_fd)
    socket.send_fds(sock, [json.dumps({"maps": maps, "progs": progs}).encode()], fds)
    sock.close()


if __name__ == "__main__":
    try:
        _child(int(sys.argv[1]))
    except Exception as exc:  # the parent reports it with our stderr
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
