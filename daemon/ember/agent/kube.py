"""Kubernetes pod metadata: PID -> container -> namespace, pod, container, labels.

Two halves:

- ``container_of``: the container id (and pod UID) of a process from its
  /proc/PID/cgroup, for containerd, CRI-O and Docker, cgroup v1 and v2, the
  systemd and cgroupfs drivers:

    v2, systemd:  0::/kubepods.slice/kubepods-burstable.slice/
                  kubepods-burstable-pod<uid_with_underscores>.slice/
                  cri-containerd-<id>.scope   (crio-<id>.scope, docker-<id>.scope)
    v2, cgroupfs: 0::/kubepods/burstable/pod<uid>/<id>
    v1:           12:cpu,cpuacct:/kubepods/besteffort/pod<uid>/<id>
                  4:memory:/docker/<id>

- ``PodWatcher``: the pods scheduled on this node, listed then watched from
  the API server (``fieldSelector=spec.nodeName=NODE``), kept in a cache by
  container id and by pod UID. The API server is never trusted beyond what
  is read: sizes are bounded and bad JSON restarts the watch. A deleted pod
  is kept for a while, so profiles of its last seconds still get its name.
"""

from __future__ import annotations

import json
import logging
import os
import re
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, KubernetesError

if TYPE_CHECKING:
    from ..config import KubernetesConfig

log = logging.getLogger(__name__)

_ID = r"([0-9a-f]{64})"
_CONTAINER_PATTERNS = (
    re.compile(rf"(?:cri-containerd|crio|docker|containerd)-{_ID}(?:\.scope)?$"),
    re.compile(rf"/{_ID}$"),
)
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_]"
                      r"[0-9a-f]{12})(?:\.slice)?(?:/|$)")
_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")
_MAX_LIST_BYTES = 64 << 20
_MAX_EVENT_BYTES = 4 << 20


@dataclass(frozen=True)
class ContainerRef:
    container_id: str = ""
    pod_uid: str = ""


def container_of(cgroup_text: str) -> ContainerRef:
    """The container and pod of a process, from the text of /proc/PID/cgroup."""
    cid = uid = ""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1].rstrip("/")
        if not cid:
            for pattern in _CONTAINER_PATTERNS:
                m = pattern.search(path)
                if m:
                    cid = m.group(1)
                    break
        if not uid:
            m = _POD_UID.search(path)
            if m:
                uid = m.group(1).replace("_", "-")
    return ContainerRef(cid, uid)


def read_container(pid: int, proc: Path = Path("/proc")) -> ContainerRef:
    try:
        return container_of((proc / str(pid) / "cgroup").read_text())
    except OSError:
        return ContainerRef()


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    pod: str
    uid: str
    labels: tuple[tuple[str, str], ...] = ()
    containers: tuple[tuple[str, str], ...] = ()   # (container id, container name)

    def labels_for(self, container_id: str, pod_labels: bool = True) -> dict[str, str]:
        out = {"namespace": self.namespace, "pod": self.pod}
        name = dict(self.containers).get(container_id)
        if name:
            out["container"] = name
        if pod_labels:
            for k, v in self.labels:
                out["pod_label_" + _LABEL_CHARS.sub("_", k)] = v
        return out


def pod_info(obj: dict[str, Any]) -> PodInfo | None:
    """A PodInfo from one Pod object of the API, or None when malformed."""
    try:
        meta = obj["metadata"]
        status = obj.get("status") or {}
        containers = []
        for key in ("containerStatuses", "initContainerStatuses",
                    "ephemeralContainerStatuses"):
            for cs in status.get(key) or []:
                cid = str(cs.get("containerID") or "")
                # "containerd://<id>", "cri-o://<id>", "docker://<id>"
                cid = cid.rpartition("://")[2]
                if re.fullmatch(r"[0-9a-f]{64}", cid):
                    containers.append((cid, str(cs.get("name", ""))))
        labels = meta.get("labels") or {}
        return PodInfo(namespace=str(meta["namespace"]), pod=str(meta["name"]),
                       uid=str(meta.get("uid", "")),
                       labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
                       containers=tuple(containers))
    except (KeyError, TypeError, AttributeError):
        return None


@dataclass
class PodCache:
    """Pods by container id and UID; deleted pods linger for ``linger_s``."""

    linger_s: float = 300.0
    clock: Callable[[], float] = time.monotonic
    _by_uid: dict[str, PodInfo] = field(default_factory=dict)
    _by_container: dict[str, str] = field(default_factory=dict)
    _deleted: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, pod: PodInfo) -> None:
        with self._lock:
            self._by_uid[pod.uid] = pod
            self._deleted.pop(pod.uid, None)
            for cid, _ in pod.containers:
                self._by_container[cid] = pod.uid

    def delete(self, uid: str) -> None:
        with self._lock:
            if uid in self._by_uid:
                self._deleted[uid] = self.clock()

    def replace_all(self, pods: list[PodInfo]) -> None:
        """A fresh list: pods missing from it count as deleted."""
        fresh = {p.uid for p in pods}
        for pod in pods:
            self.put(pod)
        for uid in list(self._by_uid):
            if uid not in fresh:
                self.delete(uid)

    def expire(self) -> None:
        now = self.clock()
        with self._lock:
            for uid, since in list(self._deleted.items()):
                if now - since > self.linger_s:
                    pod = self._by_uid.pop(uid, None)
                    del self._deleted[uid]
                    for cid, _ in pod.containers if pod else ():
                        self._by_container.pop(cid, None)

    def lookup(self, ref: ContainerRef) -> PodInfo | None:
        with self._lock:
            uid = self._by_container.get(ref.container_id) or ref.pod_uid
            return self._by_uid.get(uid) if uid else None

    def __len__(self) -> int:
        return len(self._by_uid)


class ApiClient:
    """Just enough of the API server: GET with a bearer token over TLS."""

    def __init__(self, server: str, token_file: str, ca_file: str, timeout: float = 30):
        self.server = server.rstrip("/")
        self.token_file = token_file
        self.timeout = timeout
        self.context: ssl.SSLContext | None = None
        if self.server.startswith("https://"):
            self.context = ssl.create_default_context(
                cafile=ca_file if ca_file and Path(ca_file).exists() else None)

    def _request(self, path: str, query: dict[str, str]) -> urllib.request.Request:
        url = f"{self.server}{path}?{urllib.parse.urlencode(query)}"
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        if self.token_file and Path(self.token_file).exists():
            # re-read each time: projected service account tokens rotate
            req.add_header("Authorization",
                           f"Bearer {Path(self.token_file).read_text().strip()}")
        return req

    def get(self, path: str, query: dict[str, str]) -> dict[str, Any]:
        with urllib.request.urlopen(self._request(path, query), timeout=self.timeout,
                                    context=self.context) as r:
            body = r.read(_MAX_LIST_BYTES + 1)
        if len(body) > _MAX_LIST_BYTES:
            raise ValueError(f"{path}: response over {_MAX_LIST_BYTES} bytes")
        out = json.loads(body)
        if not isinstance(out, dict):
            raise ValueError(f"{path}: not a JSON object")
        return out

    def stream(self, path: str, query: dict[str, str]) -> Iterator[dict[str, Any]]:
        """Watch events, one JSON object per line."""
        with urllib.request.urlopen(self._request(path, query), timeout=self.timeout,
                                    context=self.context) as r:
            while True:
                line = r.readline(_MAX_EVENT_BYTES + 1)
                if not line:
                    return
                if len(line) > _MAX_EVENT_BYTES:
                    raise ValueError("watch event too large")
                if line.strip():
                    event = json.loads(line)
                    if isinstance(event, dict):
                        yield event


class PodWatcher:
    """Keeps a PodCache of this node's pods current: list, then watch from
    the list's resourceVersion; any failure waits (backoff) and lists again."""

    def __init__(self, api: ApiClient, node: str, cache: PodCache | None = None,
                 watch_timeout_s: int = 300,
                 on_error: Callable[[KubernetesError], None] | None = None):
        self.api = api
        self.on_error = on_error or (lambda exc: None)
        self.node = node
        self.cache = cache or PodCache()
        self.watch_timeout_s = watch_timeout_s
        self.errors = 0
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pod-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def list_once(self) -> str:
        """List the node's pods into the cache; returns the resourceVersion."""
        body = self.api.get("/api/v1/pods", {"fieldSelector": f"spec.nodeName={self.node}"})
        pods = [p for p in (pod_info(o) for o in body.get("items") or []) if p]
        self.cache.replace_all(pods)
        self.synced.set()
        return str((body.get("metadata") or {}).get("resourceVersion", ""))

    def watch_once(self, resource_version: str) -> str:
        """Apply watch events until the server ends the stream; the last
        resourceVersion seen."""
        query = {"fieldSelector": f"spec.nodeName={self.node}", "watch": "1",
                 "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(self.watch_timeout_s)}
        for event in self.api.stream("/api/v1/pods", query):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":  # e.g. 410 Gone: the version is too old
                raise ValueError(f"watch error: {obj.get('message', obj)}")
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if rv:
                resource_version = str(rv)
            if kind in ("ADDED", "MODIFIED"):
                pod = pod_info(obj)
                if pod:
                    self.cache.put(pod)
            elif kind == "DELETED":
                uid = (obj.get("metadata") or {}).get("uid")
                if uid:
                    self.cache.delete(str(uid))
            self.cache.expire()
        return resource_version

    def _run(self) -> None:
        backoff = 1.0
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self.list_once()
                rv = self.watch_once(rv)
                backoff = 1.0
            except Exception as exc:  # network, HTTP, JSON: list again after a pause
                self.errors += 1
                self.on_error(KubernetesError(str(exc)))
                log.warning("kubernetes pod watch: %s (retrying in %.0fs)", exc, backoff)
                rv = ""
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 60.0)


def pod_watcher(cfg: KubernetesConfig, on_error: Callable[[KubernetesError], None]
                ) -> PodWatcher | None:
    """The watcher the agent's config asks for (None when disabled)."""
    if not cfg.enabled:
        return None
    node = cfg.node_name or os.environ.get("NODE_NAME", "")
    if not node:
        raise ConfigError("agent.kubernetes.enabled needs kubernetes.node_name or $NODE_NAME")
    server = cfg.api_server
    if not server:
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ConfigError("agent.kubernetes: not in a cluster ($KUBERNETES_SERVICE_HOST "
                              "unset): set kubernetes.api_server")
        server = f"https://{host}:{port}" if ":" not in host else f"https://[{host}]:{port}"
    return PodWatcher(ApiClient(server, cfg.token_file, cfg.ca_file), node, on_error=on_error)
