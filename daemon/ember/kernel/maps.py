"""ember's BPF maps, addressed by file descriptor (system calls in syscalls.py).

bcc's Python table classes are not used for draining: in bcc 0.26 the batch
lookup passes the same integer as batch token and element count, and
``StackTrace.clear()`` does nothing; and the daemon does not load bcc at all
(its programs are compiled in a child process, build.py). Each method does
one system call (batches: one per bucket run) and reports errors with errno.
"""

from __future__ import annotations

import array
import ctypes as ct
import errno
import mmap
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from .. import abi
from ..errors import BpfError
from . import syscalls
from .syscalls import possible_cpus

S = TypeVar("S", bound=ct.Structure)

__all__ = ["BpfMap", "PerCpuArray", "RowArray", "StackMap", "UnwindMaps", "possible_cpus"]


class BpfMap:
    """One map, addressed by its file descriptor."""

    def __init__(self, name: str, fd: int, key_type: Any, value_type: Any, max_entries: int):
        self.name = name
        self.fd = fd
        self.key_type = key_type
        self.value_type = value_type
        self.max_entries = max_entries

    def _fail(self, what: str, exc: OSError) -> BpfError:
        return BpfError(f"{what} on map {self.name}: {exc.strerror} (errno {exc.errno})")

    def lookup(self, key: Any) -> Any | None:
        value = self.value_type()
        try:
            syscalls.map_lookup(self.fd, key, value)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise self._fail("lookup", exc) from None
        return value

    def update(self, key: Any, value: Any) -> None:
        try:
            syscalls.map_update(self.fd, key, value)
        except OSError as exc:
            raise self._fail("update", exc) from None

    def delete(self, key: Any) -> bool:
        try:
            syscalls.map_delete(self.fd, key)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise self._fail("delete", exc) from None
        return True

    def keys(self) -> Iterator[Any]:
        """Iterate keys with get_next_key (for maps without batch support)."""
        key = self.key_type()
        prev: Any = None
        while True:
            try:
                syscalls.map_next_key(self.fd, prev, key)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return
                raise self._fail("get_next_key", exc) from None
            yield key
            prev, key = key, self.key_type()

    def lookup_batch(self) -> list[tuple[Any, Any]]:
        """Every (key, value) of a hash map, one bucket at a time.

        The kernel copies each bucket under its lock, so an element that stays
        in the map during the whole call is returned exactly once.
        """
        n = self.max_entries
        keys = (self.key_type * n)()
        values = (self.value_type * n)()
        token = ct.c_uint32(0)
        out_token = ct.c_uint32(0)
        ksize, vsize = ct.sizeof(self.key_type), ct.sizeof(self.value_type)
        total = 0
        first = True
        while total < n:
            rc, count = syscalls.map_lookup_batch(
                self.fd, None if first else token, out_token,
                ct.addressof(keys) + ksize * total, ct.addressof(values) + vsize * total,
                n - total)
            total += count
            if rc != 0:
                if rc == -errno.ENOENT:  # walked past the last bucket
                    break
                raise BpfError(f"lookup_batch on map {self.name}: {errno.errorcode[-rc]}")
            token.value = out_token.value
            first = False
        return [(keys[i], values[i]) for i in range(total)]

    def delete_batch(self, keys: Sequence[Any]) -> int:
        """Delete the given keys; returns how many were deleted."""
        if not keys:
            return 0
        arr = (self.key_type * len(keys))(*keys)
        rc, count = syscalls.map_delete_batch(self.fd, ct.addressof(arr), len(keys))
        if rc != 0:
            # A key that vanished stops the batch: fall back to one by one.
            return count + sum(self.delete(k) for k in keys[count:])
        return count


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


class RingBuffer:
    """A BPF_MAP_TYPE_RINGBUF map, consumed through its mmap'ed pages
    (kernel/bpf/ringbuf.c): a consumer position page (read-write), then the
    producer position page and the data area mapped twice in a row (read
    only), so a record never wraps. Each record has an 8-byte header whose
    length word carries BUSY (still being written) and DISCARD bits."""

    _BUSY = 1 << 31
    _DISCARD = 1 << 30
    _HDR = 8

    def __init__(self, name: str, fd: int, size: int):
        import mmap
        import select

        self.name = name
        self.size = size
        page = mmap.PAGESIZE
        self._page = page
        try:
            self._consumer = mmap.mmap(fd, page, mmap.MAP_SHARED,
                                       mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
            self._producer = mmap.mmap(fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ,
                                       offset=page)
        except OSError as exc:
            raise BpfError(f"mmap of ring buffer {name}: {exc.strerror}") from None
        self._poll = select.epoll()
        self._poll.register(fd, select.EPOLLIN)

    def fileno(self) -> int:
        return self._poll.fileno()

    def wait(self, timeout: float) -> None:
        """Block until records may be there, or timeout seconds pass."""
        self._poll.poll(timeout)

    def consume(self) -> list[bytes]:
        """Every committed record since the last call, in order."""
        import struct

        out = []
        cons = struct.unpack_from("=Q", self._consumer, 0)[0]
        prod = struct.unpack_from("=Q", self._producer, 0)[0]
        while cons < prod:
            off = self._page + (cons & (self.size - 1))
            word = struct.unpack_from("=I", self._producer, off)[0]
            if word & self._BUSY:
                break
            length = word & ~(self._BUSY | self._DISCARD)
            if not word & self._DISCARD:
                out.append(self._producer[off + self._HDR:off + self._HDR + length])
            cons += (length + self._HDR + 7) & ~7
            struct.pack_into("=Q", self._consumer, 0, cons)
        return out

    def close(self) -> None:
        self._poll.close()
        self._consumer.close()
        self._producer.close()


class RowArray:
    """ember_unwind_rows: an mmap-able BPF array of unwind rows, written
    through a mapping of it (one memory copy per object, not a system call
    per row). The mapping lives only while writing: pages of a BPF array
    mapped into the agent count in its RSS. Values are 8-byte aligned."""

    STRIDE = (ct.sizeof(abi.UnwindRow) + 7) & ~7

    def __init__(self, name: str, fd: int, max_entries: int):
        self.name = name
        self.fd = fd
        self.max_entries = max_entries

    def _map(self, first: int, n: int) -> tuple[mmap.mmap, int]:
        """A mapping of the pages holding rows [first, first + n), and the
        offset of row first in it."""
        start = first * self.STRIDE
        base = start - start % mmap.ALLOCATIONGRANULARITY
        size = (first + n) * self.STRIDE - base
        try:
            return mmap.mmap(self.fd, size, mmap.MAP_SHARED,
                             mmap.PROT_READ | mmap.PROT_WRITE, offset=base), start - base
        except OSError as exc:
            raise BpfError(f"mmap of map {self.name}: {exc.strerror or exc}") from None

    def write(self, start: int, rows: bytes) -> None:
        """Rows packed as ember_unwind_row (12 bytes each) from index start."""
        size = ct.sizeof(abi.UnwindRow)
        n = len(rows) // size
        if start < 0 or start + n > self.max_entries:
            raise BpfError(f"{self.name}: rows {start}..{start + n} past {self.max_entries}")
        if not n:
            return
        mm, at = self._map(start, n)
        try:
            if size == self.STRIDE:
                mm[at:at + n * size] = rows
            else:
                dst = np.frombuffer(mm, dtype=np.uint8, count=n * self.STRIDE, offset=at)
                dst.reshape(n, self.STRIDE)[:, :size] = np.frombuffer(
                    rows, dtype=np.uint8, count=n * size).reshape(n, size)
                del dst
        finally:
            mm.close()

    def read(self, index: int) -> abi.UnwindRow:
        mm, at = self._map(index, 1)
        try:
            return abi.UnwindRow.from_buffer_copy(mm[at:at + ct.sizeof(abi.UnwindRow)])
        finally:
            mm.close()


class UnwindMaps:
    """One program's unwind maps: the rows array and the processes' mappings
    (implements unwind.loader.UnwindTarget)."""

    def __init__(self, rows: RowArray, procs: BpfMap, python: BpfMap | None = None):
        self.rows = rows
        self.procs = procs
        self.python = python

    @property
    def row_capacity(self) -> int:
        return self.rows.max_entries

    @property
    def process_capacity(self) -> int:
        return self.procs.max_entries

    def write_rows(self, start: int, rows: bytes) -> None:
        self.rows.write(start, rows)

    def set_process(self, pid: int, proc: abi.UnwindProc) -> None:
        self.procs.update(ct.c_uint32(pid), proc)

    def forget_process(self, pid: int) -> None:
        self.procs.delete(ct.c_uint32(pid))
        self.forget_python(pid)

    def set_python(self, pid: int, value: abi.PyProc) -> None:
        if self.python is not None:
            self.python.update(ct.c_uint32(pid), value)

    def forget_python(self, pid: int) -> None:
        if self.python is not None:
            self.python.delete(ct.c_uint32(pid))

    def close(self) -> None:
        pass


def read_ustack(m: BpfMap, stack_id: int) -> tuple[tuple[int, ...], int] | None:
    """A stack walked from unwind tables: (addresses leaf first, how it ended)."""
    value = m.lookup(ct.c_uint32(stack_id))
    if value is None:
        return None
    n = min(int(value.len), abi.MAX_STACK_DEPTH)
    ips = array.array("Q", bytes(value.ips))
    return tuple(ips[:n]), int(value.end)
