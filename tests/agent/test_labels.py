"""A process's identity as labels: container ids and cgroups."""

from __future__ import annotations

from pathlib import Path

from ember.agent.labels import ProcessLabels, cgroup_of, container_id, series_labels
from ember.model import CPU

HEX = "a" * 64


def test_container_ids() -> None:
    assert container_id("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2."
                        f"slice/cri-containerd-{HEX}.scope") == HEX
    assert container_id(f"/kubepods/besteffort/pod1-2/{HEX}") == HEX
    assert container_id(f"/kubepods/pod1/crio-{HEX}") == HEX
    assert container_id(f"/system.slice/docker-{HEX}.scope") == HEX
    assert container_id("/user.slice/user-0.slice/session-1.scope") == ""


def test_cgroup_of(tmp_path: Path) -> None:
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "cgroup").write_text("0::/system.slice/x.service\n")
    assert cgroup_of(5, tmp_path) == "/system.slice/x.service"
    assert cgroup_of(6, tmp_path) == ""


def test_series_labels() -> None:
    meta = ProcessLabels(pid=10, comm="app", executable="/usr/bin/app", build_id="abcd")
    assert series_labels(CPU.profile_type(99), meta, {"host": "h"}, {"pod": "p"}) == {
        "__name__": "ember_cpu", "host": "h", "pid": "10", "comm": "app",
        "executable": "/usr/bin/app", "build_id": "abcd", "pod": "p"}
