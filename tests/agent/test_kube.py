"""Pod metadata: container ids from every cgroup layout, and the pod watch
against a local server that answers like the API server, from recorded pod
lists and watch events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ember.agent.kube import ApiClient, ContainerRef, PodCache, PodWatcher, container_of
from ember.agent.relabel import relabel
from ember.config import Rule
from tests.support import FIXTURES
from tests.support.kube import FakeApiServer, fake_api_server

KUBE = FIXTURES / "kube"
A, B, C, D = ("a" * 63 + "1", "b" * 63 + "2", "c" * 63 + "3", "d" * 63 + "4")
UID = "0f3c2a1e-5b6d-4c7e-8f90-123456789abc"


@pytest.mark.parametrize(("text", "cid", "uid"), [
    # cgroup v2, systemd driver: containerd, CRI-O, Docker
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
     f"{UID.replace('-', '_')}.slice/cri-containerd-{A}.scope\n", A, UID),
    (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
     f"{UID.replace('-', '_')}.slice/crio-{C}.scope\n", C, UID),
    (f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/docker-{D}.scope\n",
     D, UID),
    # cgroup v2, cgroupfs driver
    (f"0::/kubepods/burstable/pod{UID}/{A}\n", A, UID),
    # cgroup v1, cgroupfs and systemd drivers, several hierarchies
    (f"12:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{B}\n11:memory:/kubepods/besteffort/"
     f"pod{UID}/{B}\n1:name=systemd:/kubepods/besteffort/pod{UID}/{B}\n", B, UID),
    (f"4:memory:/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/"
     f"cri-containerd-{A}.scope\n0::/\n", A, UID),
    # plain Docker and a CRI-O conmon-less path, outside Kubernetes
    (f"0::/system.slice/docker-{D}.scope\n", D, ""),
    (f"3:pids:/docker/{D}\n", D, ""),
    (f"0::/machine.slice/libpod-conmon/crio-{C}\n", C, ""),
    # no container: a systemd service, a user session, the root
    ("0::/system.slice/nginx.service\n", "", ""),
    ("0::/user.slice/user-0.slice/session-3.scope\n", "", ""),
    ("0::/\n", "", ""),
    ("", "", ""),
])
def test_container_of_every_layout(text: str, cid: str, uid: str) -> None:
    assert container_of(text) == ContainerRef(cid, uid)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiClient]:
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    with fake_api_server() as url:
        yield ApiClient(url, str(token), "")


def test_list_then_watch(api: ApiClient) -> None:
    w = PodWatcher(api, "node-1")
    rv = w.list_once()
    assert rv == "1050" and len(w.cache) == 2
    query, auth = FakeApiServer.requests[0]
    assert query["fieldSelector"] == ["spec.nodeName=node-1"] and auth == "Bearer secret-token"
    pod = w.cache.lookup(ContainerRef(B, ""))
    assert pod is not None
    assert pod.labels_for(B) == {
        "namespace": "shop", "pod": "checkout-7d9f8b6c5-x2x9q", "container": "envoy",
        "pod_label_app": "checkout", "pod_label_pod_template_hash": "7d9f8b6c5",
        "pod_label_app_kubernetes_io_part_of": "shop"}
    # a container not listed yet is still found by its pod's UID
    assert w.cache.lookup(ContainerRef("e" * 64, UID)) is pod

    rv = w.watch_once(rv)
    assert rv == "1080"  # the last event's version
    query, _ = FakeApiServer.requests[-1]
    assert query["watch"] == ["1"] and query["resourceVersion"] == ["1050"]
    added = w.cache.lookup(ContainerRef(D, ""))
    assert added is not None and added.labels_for(D)["container"] == "report"
    modified = w.cache.lookup(ContainerRef(A, ""))
    assert modified is not None and dict(modified.labels)["version"] == "v2"
    # deleted pods linger (their last profiles still get names), then go
    assert w.cache.lookup(ContainerRef(C, "")) is not None
    w.cache.linger_s = 0
    w.cache.expire()
    assert w.cache.lookup(ContainerRef(C, "")) is None and len(w.cache) == 2


def test_watcher_recovers_from_errors(api: ApiClient) -> None:
    FakeApiServer.fail_next = 2
    errors: list[Exception] = []
    w = PodWatcher(api, "node-1", on_error=errors.append)
    w.start()
    try:
        assert w.synced.wait(10), "never listed"
    finally:
        w.stop()
    assert len(errors) >= 2 and all(e.label == "kubernetes" for e in errors)  # type: ignore[attr-defined]
    assert len(w.cache) >= 2


def test_malformed_answers_never_crash(api: ApiClient, tmp_path: Path) -> None:
    cache = PodCache()
    from ember.agent.kube import pod_info
    for bad in ({}, {"metadata": None}, {"metadata": {"name": "x"}}, {"metadata": []},
                {"metadata": {"name": "p", "namespace": "n"}, "status": {"containerStatuses": 3}}):
        pod = pod_info(bad)  # type: ignore[arg-type]
        if pod is not None:
            cache.put(pod)
    assert cache.lookup(ContainerRef("", "")) is None


def test_pod_labels_through_relabeling(api: ApiClient) -> None:
    w = PodWatcher(api, "node-1")
    w.list_once()
    pod = w.cache.lookup(ContainerRef(A, ""))
    assert pod is not None
    labels = {"__name__": "ember_cpu", "pid": "7", **pod.labels_for(A)}
    rules = [Rule(source_labels=("namespace",), regex="shop|web", action="keep"),
             Rule(regex="pod_label_pod_template_hash", action="labeldrop"),
             Rule(source_labels=("namespace", "container"), separator="/",
                  target_label="service", replacement="$1")]
    out = relabel(labels, rules)
    assert out is not None and out["service"] == "shop/checkout"
    assert "pod_label_pod_template_hash" not in out
    assert relabel({**labels, "namespace": "kube-system"}, rules) is None


def test_recorded_fixtures_are_json() -> None:
    json.loads((KUBE / "pods.json").read_text())
    for line in (KUBE / "watch.jsonl").read_text().splitlines():
        assert json.loads(line)["type"] in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")
