"""Raw access to ember's BPF maps through libbcc's syscall wrappers.

bcc's Python table classes are not used for draining: in bcc 0.26 the batch
lookup passes the same integer as batch token and element count, and
``StackTrace.clear()`` does nothing. These few functions do exactly one
syscall each and report errors with errno.
"""

from __future__ import annotations

import array
import ctypes as ct
import errno
import os
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from . import abi
from .errors import BpfError

S = TypeVar("S", bound=ct.Structure)


def _lib() -> Any:
    from bcc.libbcc import lib  # the BPF edge: imported only where bcc is present

    return lib


def possible_cpus() -> int:
    """Number of possible CPUs, the stride of per-CPU map values."""
    from bcc.utils import get_possible_cpus

    return len(get_possible_cpus())


class BpfMap:
    """One map, addressed by its file descriptor."""

    def __init__(self, name: str, fd: int, key_type: Any, value_type: Any, max_entries: int):
        self.name = name
        self.fd = fd
        self.key_type = key_type
        self.value_type = value_type
        self.max_entries = max_entries

    def _fail(self, what: str) -> BpfError:
        err = ct.get_errno()
        return BpfError(f"{what} on map {self.name}: {os.strerror(err)} (errno {err})")

    def lookup(self, key: Any) -> Any | None:
        value = self.value_type()
        if _lib().bpf_lookup_elem(self.fd, ct.byref(key), ct.byref(value)) != 0:
            if ct.get_errno() == errno.ENOENT:
                return None
            raise self._fail("lookup")
        return value

    def update(self, key: Any, value: Any) -> None:
        if _lib().bpf_update_elem(self.fd, ct.byref(key), ct.byref(value), 0) != 0:
            raise self._fail("update")

    def delete(self, key: Any) -> bool:
        if _lib().bpf_delete_elem(self.fd, ct.byref(key)) != 0:
            if ct.get_errno() == errno.ENOENT:
                return False
            raise self._fail("delete")
        return True

    def keys(self) -> Iterator[Any]:
        """Iterate keys with get_next_key (for maps without batch support)."""
        lib = _lib()
        key = self.key_type()
        prev: Any = None
        while True:
            rc = lib.bpf_get_next_key(self.fd, ct.byref(prev) if prev is not None else None,
                                      ct.byref(key))
            if rc != 0:
                if ct.get_errno() == errno.ENOENT:
                    return
                raise self._fail("get_next_key")
            yield key
            prev, key = key, self.key_type()

    def lookup_batch(self) -> list[tuple[Any, Any]]:
        """Every (key, value) of a hash map, one bucket at a time.

        The kernel copies each bucket under its lock, so an element that stays
        in the map during the whole call is returned exactly once.
        """
        lib = _lib()
        n = self.max_entries
        keys = (self.key_type * n)()
        values = (self.value_type * n)()
        token = ct.c_uint32(0)
        out_token = ct.c_uint32(0)
        total = 0
        first = True
        while total < n:
            count = ct.c_uint32(n - total)
            rc = lib.bpf_lookup_batch(
                self.fd,
                None if first else ct.byref(token),
                ct.byref(out_token),
                ct.byref(keys, ct.sizeof(self.key_type) * total),
                ct.byref(values, ct.sizeof(self.value_type) * total),
                ct.byref(count),
            )
            err = ct.get_errno()
            total += count.value
            if rc != 0:
                if err == errno.ENOENT:  # walked past the last bucket
                    break
                raise BpfError(f"lookup_batch on map {self.name}: {os.strerror(err)}")
            token.value = out_token.value
            first = False
        return [(keys[i], values[i]) for i in range(total)]

    def delete_batch(self, keys: Sequence[Any]) -> int:
        """Delete the given keys; returns how many were deleted."""
        if not keys:
            return 0
        lib = _lib()
        arr = (self.key_type * len(keys))(*keys)
        count = ct.c_uint32(len(keys))
        if lib.bpf_delete_batch(self.fd, ct.byref(arr), ct.byref(count)) != 0:
            # A key that vanished stops the batch: fall back to one by one.
            return int(count.value) + sum(self.delete(k) for k in keys[count.value:])
        return int(count.value)


class StackMap(BpfMap):
    """A BPF_MAP_TYPE_STACK_TRACE map: u32 id -> up to 127 instruction pointers."""

    def __init__(self, name: str, fd: int, max_entries: int):
        super().__init__(name, fd, ct.c_uint32, ct.c_uint64 * abi.MAX_STACK_DEPTH, max_entries)

    def read(self, stack_id: int) -> tuple[int, ...] | None:
        value = self.lookup(ct.c_uint32(stack_id))
        if value is None:
            return None
        ips = array.array("Q", bytes(value))  # C speed: no Python int per slot
        return tuple(ips[: ips.index(0)] if 0 in ips else ips)

    def clear(self) -> int:
        ids = [ct.c_uint32(k.value) for k in self.keys()]
        return sum(self.delete(k) for k in ids)


class PerCpuArray(BpfMap):
    """A per-CPU array of u64 counters, read summed over CPUs."""

    def __init__(self, name: str, fd: int, max_entries: int):
        self.ncpus = possible_cpus()
        super().__init__(name, fd, ct.c_uint32, ct.c_uint64 * self.ncpus, max_entries)

    def read_all(self) -> list[int]:
        return [sum(v) if (v := self.lookup(ct.c_uint32(i))) is not None else 0
                for i in range(self.max_entries)]
