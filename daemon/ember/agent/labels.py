"""What identifies a process in its profiles' labels: pid, comm, executable,
build id, cgroup and container, read once per process (and again when its
PID is reused), plus the pod's metadata on Kubernetes, the host, the
configured labels, and the relabeling rules over all of them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..cache import BoundedCache
from ..config import Rule
from ..model import ProfileType, Sample, profile_kind
from ..symbols.symbolizer import Symbolizer
from .kube import ContainerRef, PodWatcher, container_of, read_container
from .relabel import relabel


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




class ProcessLabeler:
    """Labels of each process's profiles, before and after relabeling."""

    def __init__(self, symbolizer: Symbolizer, common: dict[str, str],
                 rules: Sequence[Rule] = (), pods: PodWatcher | None = None,
                 pod_labels: bool = True, proc: Path = Path("/proc")):
        self.symbolizer = symbolizer
        self.common = common          # host and the configured labels
        self.rules = tuple(rules)
        self.pods = pods
        self.pod_labels = pod_labels
        self.proc = proc
        # pid -> (its start time, its labels): read again when the PID is reused
        self._known: BoundedCache[int, tuple[int, ProcessLabels]] = BoundedCache(
            "process_labels", 1 << 16, entry_bytes=400)

    def process(self, pid: int, thread_name: str = "") -> ProcessLabels:
        proc = self.symbolizer.processes.get(pid)
        start = proc.start_time if proc else -1
        cached = self._known.get(pid)
        if cached and cached[0] == start:
            return cached[1]
        build_id = ""
        if proc is not None and proc.exe:
            _, obj = self.symbolizer.objects.open([self.proc / str(pid) / "exe",
                                                   Path(proc.exe)])
            build_id = (obj.build_id or "") if obj else ""
        ref = read_container(pid, self.proc)
        meta = ProcessLabels(pid=pid, comm=read_comm(pid, self.proc) or thread_name,
                             executable=(proc.exe or "") if proc else "", build_id=build_id,
                             cgroup=cgroup_of(pid, self.proc), container_id=ref.container_id,
                             pod_uid=ref.pod_uid)
        return self._known.put(pid, (start, meta))[1]

    def comm(self, pid: int) -> str:
        return self.process(pid).comm

    def _pod(self, meta: ProcessLabels) -> dict[str, str]:
        """namespace, pod, container, pod_label_* (looked up at each drain: the
        watch may learn of a pod after its first profile)."""
        if self.pods is None or not (meta.container_id or meta.pod_uid):
            return {}
        pod = self.pods.cache.lookup(ContainerRef(meta.container_id, meta.pod_uid))
        if pod is None:
            return {}
        return pod.labels_for(meta.container_id, self.pod_labels)

    def labels(self, ptype: ProfileType, pid: int, thread_name: str) -> dict[str, str] | None:
        """A process's profile labels after relabeling; None when a keep or
        drop rule drops the profile."""
        meta = self.process(pid, thread_name)
        return relabel(series_labels(ptype, meta, self.common, self._pod(meta)), self.rules)
