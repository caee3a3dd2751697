"""What identifies a process in its profiles' labels: pid, comm, executable,
build id, cgroup and container, read once per process (and again when its
PID is reused).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..model import ProfileType, Sample, profile_kind
from .kube import container_of


@dataclass(frozen=True)
class ProcessLabels:
    pid: int
    comm: str = ""
    executable: str = ""
    build_id: str = ""
    cgroup: str = ""
    container_id: str = ""
    pod_uid: str = ""  # not a label: finds the pod when the container is not listed yet

    def as_labels(self) -> dict[str, str]:
        out = {"pid": str(self.pid), "comm": self.comm, "executable": self.executable,
               "build_id": self.build_id, "cgroup": self.cgroup,
               "container_id": self.container_id}
        return {k: v for k, v in out.items() if v}


def cgroup_of(pid: int, proc: Path = Path("/proc")) -> str:
    """The process's cgroup v2 path ('' when unknown)."""
    try:
        for line in (proc / str(pid) / "cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    except OSError:
        pass
    return ""


def container_id(cgroup: str) -> str:
    """The 64-hex container id of a containerd/CRI-O/Docker cgroup path."""
    return container_of(f"0::{cgroup}").container_id


def read_comm(pid: int, proc: Path = Path("/proc")) -> str:
    try:
        return (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def split_by_process(samples: Iterable[Sample]) -> dict[int, list[Sample]]:
    out: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        out[s.pid].append(s)
    return out


def series_labels(ptype: ProfileType, meta: ProcessLabels, common: dict[str, str],
                  extra: dict[str, str] | None = None) -> dict[str, str]:
    """A process's profile labels before relabeling: __name__, the common
    labels (host, configured ones), the process's, then extra (pod metadata)."""
    return {"__name__": profile_kind(ptype.name).series, **common, **meta.as_labels(),
            **(extra or {})}


