"""Target rules -> the PIDs and cgroup ids the BPF programs filter on.

PIDs are matched directly; comm and executable patterns are evaluated
against /proc every ``target_refresh`` (a process started in between is
picked up at the next refresh); a cgroup path selects that cgroup and every
cgroup below it, by cgroup v2 id (the directory's inode number, which is
what bpf_get_current_cgroup_id() returns), under wherever cgroup v2 is
mounted.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .. import abi
from ..config import Targets

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resolved:
    filter: int          # abi.FILTER_* bits
    pids: frozenset[int]
    cgroups: frozenset[int]


def cgroup2_root(mounts: Path = Path("/proc/self/mounts")) -> Path:
    """Where cgroup v2 is mounted: /sys/fs/cgroup on unified hosts,
    /sys/fs/cgroup/unified on hybrid ones."""
    try:
        for line in mounts.read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[2] == "cgroup2":
                return Path(parts[1])
    except OSError:
        pass
    return Path("/sys/fs/cgroup")


class TargetResolver:
    def __init__(self, targets: Targets, proc: Path = Path("/proc"),
                 cgroupfs: Path | None = None):
        self.targets = targets
        self.proc = proc
        self.cgroupfs = cgroupfs or cgroup2_root()
        self._comm = [re.compile(p) for p in targets.comm]
        self._exe = [re.compile(p) for p in targets.exe]

    def resolve(self) -> Resolved:
        t = self.targets
        if t.whole_host:
            return Resolved(0, frozenset(), frozenset())
        pids = set(t.pids)
        if self._comm or self._exe:
            pids |= self._match_processes()
        cgroups = set()
        for path in t.cgroups:
            root = self.cgroupfs / path.lstrip("/")
            if not root.is_dir():
                log.warning("target cgroup %s does not exist (yet)", path)
                continue
            for dirpath, _dirs, _files in os.walk(root):
                try:
                    cgroups.add(os.stat(dirpath).st_ino)
                except OSError:
                    continue
        flags = (abi.FILTER_PIDS if (t.pids or t.comm or t.exe) else 0) | (
            abi.FILTER_CGROUPS if t.cgroups else 0)
        return Resolved(flags, frozenset(pids), frozenset(cgroups))

    def _match_processes(self) -> set[int]:
        out = set()
        for entry in os.scandir(self.proc):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            base = self.proc / entry.name
            try:
                comm = (base / "comm").read_text().strip()
            except OSError:
                continue
            if any(r.search(comm) for r in self._comm):
                out.add(pid)
                continue
            if self._exe:
                try:
                    exe = os.readlink(base / "exe")
                except OSError:
                    continue
                if any(r.search(exe) for r in self._exe):
                    out.add(pid)
        return out
