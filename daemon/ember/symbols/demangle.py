"""C++ demangling through libstdc++'s own ``__cxa_demangle``, and Rust's
legacy scheme on top of it.

The C++ runtime already ships the reference demangler, so it is called over
ctypes rather than reimplemented. Rust's legacy symbols are Itanium names
with a trailing hash (``17h<16 hex>E``) and ``$LT$``-style escapes: after
the C++ demangler, the hash is dropped and the escapes undone, as
rustc-demangle does. Rust's v0 scheme (``_R...``) has its own parser
(rustv0.py).
Without libstdc++ names are left as they are (still correct, only mangled).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
from typing import Any

from ..cache import BoundedCache
from .rust_v0 import demangle_v0

_RUST_HASH = re.compile(r"17h[0-9a-f]{16}E$")
_RUST_ESCAPES = {"SP": "@", "BP": "*", "RF": "&", "LT": "<", "GT": ">", "LP": "(", "RP": ")",
                 "C": ","}
_RUST_ESCAPE = re.compile(r"\$(SP|BP|RF|LT|GT|LP|RP|C|u[0-9a-f]{2})\$")


def _library(soname: str, name: str, otherwise: str | None) -> Any:
    """A shared library by its usual soname, else as ctypes.util finds it
    (which runs ldconfig: ~20 ms at every start of ``ember symbolize``), else
    otherwise (None: this process's own symbols)."""
    try:
        return ctypes.CDLL(soname)
    except OSError:
        return ctypes.CDLL(ctypes.util.find_library(name) or otherwise)


@functools.cache
def _runtime() -> tuple[Any, Any] | None:
    try:
        lib = _library("libstdc++.so.6", "stdc++", "libstdc++.so.6")
        libc = _library("libc.so.6", "c", None)
    except OSError:
        return None
    fn = lib.__cxa_demangle
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t),
                   ctypes.POINTER(ctypes.c_int)]
    free = libc.free
    free.argtypes = [ctypes.c_void_p]
    return fn, free


_DEMANGLED: BoundedCache[str, str] = BoundedCache("demangled_names", 1 << 16)


def demangle(name: str) -> str:
    """The demangled form of an Itanium C++ ABI or Rust name; other names
    unchanged."""
    if not name.startswith(("_R", "_Z")):
        return name
    hit = _DEMANGLED.get(name)
    if hit is None:
        hit = _DEMANGLED.put(name, _demangle(name))
    return hit


def _demangle(name: str) -> str:
    if name.startswith("_R"):
        return demangle_v0(name.split(".", 1)[0]) or name
    if not name.startswith("_Z"):
        return name
    rt = _runtime()
    if rt is None:
        return name
    fn, free = rt
    status = ctypes.c_int(0)
    ptr = fn(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not ptr:
        return name
    try:
        out = ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        free(ptr)
    if _RUST_HASH.search(name):
        out = _rust_legacy(out)
    return out


def _rust_legacy(demangled: str) -> str:
    """'std::rt::lang_start::h0123456789abcdef' with escapes -> readable Rust."""
    head, sep, last = demangled.rpartition("::")
    if sep and re.fullmatch(r"h[0-9a-f]{16}", last):
        demangled = head
    # a path element can only start with a letter or '_' in the mangling, so
    # one that starts with an escape carries a '_' first: rustc-demangle drops it
    demangled = re.sub(r"(^|::)_(?=\$)", r"\1", demangled)

    def unescape(m: re.Match[str]) -> str:
        code = m.group(1)
        return chr(int(code[1:], 16)) if code.startswith("u") else _RUST_ESCAPES[code]

    return _RUST_ESCAPE.sub(unescape, demangled).replace("..", "::")
