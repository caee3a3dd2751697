"""C++ demangling through libstdc++'s own ``__cxa_demangle``.

The C++ runtime already ships the reference demangler, so it is called over
ctypes rather than reimplemented. Without libstdc++ names are left as they
are (still correct, only mangled).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.cache
def _runtime() -> tuple[Any, Any] | None:
    name = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
    try:
        lib = ctypes.CDLL(name)
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
    except OSError:
        return None
    fn = lib.__cxa_demangle
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t),
                   ctypes.POINTER(ctypes.c_int)]
    free = libc.free
    free.argtypes = [ctypes.c_void_p]
    return fn, free


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """The demangled form of an Itanium C++ ABI name; other names unchanged."""
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
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        free(ptr)
