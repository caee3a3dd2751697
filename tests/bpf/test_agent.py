"""The agent on the real kernel, shipping to a real collector over loopback."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from contextlib import suppress
from pathlib import Path

import pytest

from ember import config
from ember.collector.server import Collector
from ember.config import Targets
from ember.encode.pprof import decode_pprof, from_proto
from ember.encode.writeraw import PROFILE_ID_PREFIX
from ember.model import FrameKind
from ember.proto import profilestore_pb2 as ps
from tests.support.agent import agent_cfg, running_agent
from tests.support.collector import collector_at
from tests.support.net import free_port
from tests.support.record import cpu_ns, expected_samples, inclusive

pytestmark = pytest.mark.bpf

OUTAGE_S = 30  # how long the collector-down test keeps the collector away


def stored_samples(c: Collector, type_: str) -> list[tuple[str, dict[str, str], object]]:
    out = []
    for row in c.store.query(0, time.time_ns() + 10**9, {}, type_):
        out.append((row.type, row.labels, from_proto(decode_pprof(row.data))[1]))
    return out


def test_ground_truth_through_the_collector(start_workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("cpu_shares")
    port = free_port()
    c = collector_at(tmp_path, port)
    try:
        # all three programs: on-CPU, sampled off-CPU, and the exact one for runqlat
        with running_agent(agent_cfg(tmp_path, port, w.pid, runqlat=True)) as agent:
            time.sleep(5)
        assert list(agent.session.programs()) == ["cpu", "offcpu", "sched"]
        assert agent.spool.stats()[0] == 0
        code, body, _ = c.handle("/api/v1/profile", {"type": ["cpu"], "since": ["5m"],
                                                      "format": ["json"]}, "")
        assert code == 200
        rows = stored_samples(c, "ember_cpu:cpu:nanoseconds:cpu:nanoseconds")
        samples = [s for _, labels, ss in rows for s in ss]  # type: ignore[attr-defined]
        shares = inclusive(samples, ["work_a", "work_b", "work_c"], 0)
        assert abs(shares["work_a"] - 35) <= 2, shares
        assert abs(shares["work_b"] - 50) <= 2, shares
        assert abs(shares["work_c"] - 15) <= 2, shares
        labels = rows[0][1]
        assert labels["__name__"] == "ember_cpu" and labels["pid"] == str(w.pid)
        assert labels["comm"] == "cpu_shares" and labels["executable"].endswith("/cpu_shares")
        assert len(labels["build_id"]) == 40 and labels["host"] == os.uname().nodename
        # a CPU-bound process: on-CPU samples, and run-queue waits when preempted
        names = {r[1]["__name__"] for r in stored_samples(c, None)}
        assert {"ember_cpu", "ember_runqlat"} <= names <= {"ember_cpu", "ember_offcpu",
                                                           "ember_runqlat"}
        assert json.loads(body)["tree"]["value"] == sum(s.values[0] for s in samples)
    finally:
        c.close()


def test_collector_down_30s_every_sample_stored_once(start_workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("cpu_shares", seconds=120)
    port = free_port()
    c = collector_at(tmp_path, port)
    cfg = agent_cfg(tmp_path, port, w.pid, offcpu=False, runqlat=False)
    outer = cpu_ns(w.pid)
    with running_agent(cfg) as agent:
        inner = cpu_ns(w.pid)  # attached from here ...
        time.sleep(3)
        c.close()
        away = cpu_ns(w.pid)
        time.sleep(OUTAGE_S)
        away = cpu_ns(w.pid) - away
        assert agent.spool.stats()[0] >= 20  # spooled while the collector was away
        c = collector_at(tmp_path, port)
        deadline = time.monotonic() + 60
        while agent.spool.stats()[0] and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1)
        inner = cpu_ns(w.pid) - inner  # ... to here
    outer = cpu_ns(w.pid) - outer
    try:
        assert agent.spool.stats()[0] == 0
        drained = agent.metrics.samples.labels("cpu")._value.get()
        rows = list(c.store.query(0, time.time_ns() + 10**9, {}, None))
        stored = sum(r.samples for r in rows)
        assert stored == drained
        assert len(rows) == agent.metrics.profiles_built.labels("cpu")._value.get()
        # the agent was attached for at least the inner window, at most the outer
        assert away > 0.2 * OUTAGE_S * 1e9, "the workload hardly ran while away"
        low, high = expected_samples(inner, outer, cfg.frequency)
        assert low <= drained <= high, (drained, low, high)
    finally:
        c.close()


def spooled_ids(spool: Path) -> set[str]:
    ids = set()
    for f in spool.glob("*.writeraw"):
        for s in ps.WriteRawRequest.FromString(f.read_bytes()).series:
            for sample in s.samples:
                p = decode_pprof(sample.raw_profile)
                ids |= {p.string_table[i].removeprefix(PROFILE_ID_PREFIX) for i in p.comment}
    return ids


def test_sigkill_while_spooling_then_restart(start_workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("cpu_shares", seconds=120)
    port = free_port()
    spool = tmp_path / "spool"
    cmd = [sys.executable, "-m", "ember.cli", "agent", "--collector", f"127.0.0.1:{port}",
           "--interval", "1s", "--pid", str(w.pid), "--spool-dir", str(spool),
           "--metrics-listen", f"127.0.0.1:{free_port()}"]
    agent = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(spool.glob("*.writeraw"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    agent.send_signal(signal.SIGKILL)
    agent.wait()
    before = spooled_ids(spool)
    assert len(before) >= 3
    c = collector_at(tmp_path, port)
    try:
        agent = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while spooled_ids(spool) & before and time.monotonic() < deadline:
            time.sleep(0.5)
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
        assert agent.returncode == 0, err
        db = c.store._db
        stored = [r[0] for r in db.execute("SELECT profile_id FROM profiles").fetchall()]
        assert before <= set(stored)           # everything spooled before the kill arrived
        assert len(stored) == len(set(stored))  # and nothing twice
    finally:
        c.close()


@pytest.mark.skipif(not Path("/usr/bin/prometheus").exists(), reason="prometheus not installed")
def test_prometheus_scrapes_the_agent(start_workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("cpu_shares")
    metrics_port, prom_port = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n"
        f"  - job_name: ember\n    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n")
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        cfg = agent_cfg(tmp_path, free_port(), w.pid, metrics_listen=f"127.0.0.1:{metrics_port}")
        with running_agent(cfg):
            value = None
            deadline = time.monotonic() + 60
            url = (f"http://127.0.0.1:{prom_port}/api/v1/query?query="
                   "ember_samples_total%7Btype%3D%22cpu%22%7D")
            while time.monotonic() < deadline:
                time.sleep(1)
                try:
                    with urllib.request.urlopen(url, timeout=5) as r:
                        result = json.loads(r.read())["data"]["result"]
                except OSError:
                    continue
                if result and float(result[0]["value"][1]) > 0:
                    value = float(result[0]["value"][1])
                    break
            assert value is not None and value > 0
            for path, code in (("/healthz", 200), ("/readyz", 200)):
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}{path}") as r:
                    assert r.status == code
    finally:
        prom.terminate()
        prom.wait(timeout=30)


def stored_pids(c: Collector) -> set[str]:
    return {r.labels["pid"] for r in c.store.query(0, time.time_ns() + 10**9, {}, None)}


def test_comm_and_cgroup_targets_filter_in_the_kernel(start_workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from ember.agent.targets import cgroup2_root

    # (named for this test alone: a cpu_shares left running by another
    # run matched ^cpu_shares$ and was profiled too)
    comm = f"shares{os.getpid()}"[:15]
    shares, pie, other = (start_workload("cpu_shares", comm=comm), start_workload("pie_main"),
                          start_workload("cpp_names"))
    cgroup = cgroup2_root() / f"ember-test-{os.getpid()}"
    cgroup.mkdir()
    try:
        (cgroup / "cgroup.procs").write_text(str(pie.pid))
        port = free_port()
        c = collector_at(tmp_path, port)
        try:
            cfg = agent_cfg(tmp_path, port, shares.pid, offcpu=False,
                            targets=Targets(comm=(f"^{comm}$",),
                                            cgroups=(f"/{cgroup.name}",)))
            with running_agent(cfg) as agent:
                time.sleep(3)
            assert stored_pids(c) == {str(shares.pid), str(pie.pid)}
            assert str(other.pid) not in stored_pids(c)
            assert agent.metrics.targets._value.get() >= 2
        finally:
            c.close()
    finally:
        (cgroup2_root() / "cgroup.procs").write_text(str(pie.pid))
        cgroup.rmdir()


def test_sighup_moves_to_another_collector(start_workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("cpu_shares", seconds=120)
    port_a, port_b = free_port(), free_port()
    a = collector_at(tmp_path / "a", port_a)
    b = collector_at(tmp_path / "b", port_b)
    cfg = tmp_path / "ember.yaml"

    def write(port: int) -> None:
        cfg.write_text(f"agent:\n  collector: 127.0.0.1:{port}\n  interval: 1s\n"
                       f"  spool_dir: {tmp_path / 'spool'}\n"
                       f"  metrics_listen: 127.0.0.1:{free_port()}\n"
                       f"  targets:\n    pids: [{w.pid}]\n")

    write(port_a)
    agent = subprocess.Popen([sys.executable, "-m", "ember.cli", "agent", "--config", str(cfg)],
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not a.store.count() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert a.store.count() > 0
        write(port_b)
        agent.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while not b.store.count() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert b.store.count() > 0
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
        assert agent.returncode == 0 and "configuration reloaded" in err, err
    finally:
        if agent.poll() is None:
            agent.kill()
        a.close()
        b.close()


def agent_rss(workload: list[int], tmp_path: Path, limit: str, seconds: float,
              collector_port: int) -> tuple[int, list[int], str]:
    """Run ``ember agent`` (its own process, so its RSS is its own) on the
    workload with memory_limit: its RSS just before its first drain (all
    loaded and attached, nothing symbolized yet), every 0.2 s from then on,
    and its /metrics at the end."""
    metrics_port = free_port()
    cfg = tmp_path / f"agent-{limit}.yaml"
    cfg.write_text(f"""agent:
  collector: 127.0.0.1:{collector_port}
  interval: 1s
  frequency: 99
  offcpu: false
  memory_limit: {limit}
  metrics_listen: 127.0.0.1:{metrics_port}
  spool_dir: {tmp_path / ("spool-" + limit)}
  targets:
    pids: [{", ".join(map(str, workload))}]
""")
    agent = subprocess.Popen([sys.executable, "-m", "ember.cli", "agent", "--config", str(cfg)],
                             stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    before: list[int] = []
    rss: list[int] = []

    def sample(into: list[int]) -> None:
        for line in Path(f"/proc/{agent.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                into.append(int(line.split()[1]) << 10)

    try:
        deadline = time.monotonic() + 120
        while "ember_last_drain_timestamp_seconds 0.0" in scrape(url, deadline):
            sample(before)  # compiling, attaching, until the first drain ends
            time.sleep(0.05)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sample(rss)
            time.sleep(0.2)
        text = scrape(url, time.monotonic() + 10)
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err
    # most readings before the first drain ended are of the agent compiling
    # and attaching, before it symbolized anything
    return int(statistics.median(before)), rss, text


def scrape(url: str, deadline: float) -> str:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return str(r.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def distinct_builds(binary: Path, n: int, where: Path) -> list[Path]:
    """n copies of binary, each with a build id of its own (so the agent
    indexes each symbol table apart, as for n different programs)."""
    notes = subprocess.run(["readelf", "-n", str(binary)], capture_output=True, text=True,
                           check=True).stdout
    old = bytes.fromhex(notes.split("Build ID: ")[1].split()[0])
    image = binary.read_bytes()
    assert image.count(old) == 1
    out = []
    for i in range(n):
        copy = where / f"{binary.name}-{i}"
        copy.write_bytes(image.replace(old, os.urandom(len(old))))
        copy.chmod(0o755)
        out.append(copy)
    return out


def counter(text: str, name: str) -> dict[str, float]:
    """A labelled counter of a /metrics page, by its cache label."""
    return {line.split('cache="')[1].split('"')[0]: float(line.split()[-1])
            for line in text.splitlines() if line.startswith(name + "{")}


def test_memory_ceiling_holds_under_a_workload_that_needs_more(fixture_bin, tmp_path: Path
                                                                ) -> None:  # type: ignore[no-untyped-def]
    """40 programs, each with a 50,000-function symbol table of its own
    (about 1.4 MB indexed). Unbounded, the agent's RSS grows by all of them;
    with a limit halfway between its idle RSS and that, RSS sampled every
    0.2 s never passes the limit, what was given up is counted, and the
    profiles stay named (tables evicted are read again when needed)."""
    copies = distinct_builds(fixture_bin / "many_symbols", 40, tmp_path)
    work = [subprocess.Popen([str(c), "180"], stdout=subprocess.PIPE, text=True) for c in copies]
    port = free_port()
    c = collector_at(tmp_path, port)
    try:
        pids = [int((w.stdout.readline() if w.stdout else "").split()[1]) for w in work]
        idle, free, _ = agent_rss(pids, tmp_path, "4GiB", 15, port)
        needs = max(free)
        assert needs - idle > 32 << 20, (idle >> 20, needs >> 20)  # the workload needs more
        limit = ((idle + needs) // 2) >> 20 << 20
        _, held, text = agent_rss(pids, tmp_path, f"{limit >> 20}MiB", 15, port)
        print(f"\nmemory ceiling: idle {idle >> 20} MiB, unbounded peak {needs >> 20} MiB, "
              f"limit {limit >> 20} MiB, peak under the limit {max(held) >> 20} MiB")
        assert max(held) <= limit, (max(held) >> 20, limit >> 20, idle >> 20, needs >> 20)
        evicted = counter(text, "ember_cache_evictions_total")
        shrunk = counter(text, "ember_memory_shrinks_total")
        # the symbol tables did not all fit, and that was counted
        assert evicted.get("symbol_tables", 0) + shrunk.get("symbol_tables", 0) > 0, \
            (evicted, shrunk)
        samples = [s for _, _, ss in stored_samples(c, "ember_cpu:cpu:nanoseconds:cpu:nanoseconds")
                   for s in ss]  # type: ignore[attr-defined]
        leaves = [(s.values[0], [f for f in s.frames if f.kind == FrameKind.USER][-1:])
                  for s in samples]
        total = sum(v for v, leaf in leaves if leaf and not leaf[0].name.startswith("[lost"))
        named = sum(v for v, leaf in leaves if leaf and leaf[0].name != "[unknown]"
                    and not re.search(r"\+0x[0-9a-f]+$", leaf[0].name))
        assert total > 100 and named >= 0.97 * total, (named, total)
        assert any(f.name == "spin" for s in samples for f in s.frames)
    finally:
        c.close()
        for w in work:
            w.kill()
            w.wait()


def test_pod_metadata_labels(start_workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A process in a cgroup laid out as a kubelet's (cgroupfs driver), a local
    API server listing its pod: its profiles carry namespace, pod, container
    and pod labels, after the relabeling rules."""
    from ember.agent.targets import cgroup2_root
    from ember.config import Rule
    from tests.support.kube import fake_api_server

    cid = "a" * 63 + "1"
    uid = "0f3c2a1e-5b6d-4c7e-8f90-123456789abc"
    pod_dir = cgroup2_root() / "kubepods" / "besteffort" / f"pod{uid}"
    cg = pod_dir / cid
    cg.mkdir(parents=True, exist_ok=True)
    w = start_workload("cpu_shares")
    (cg / "cgroup.procs").write_text(str(w.pid))
    token = tmp_path / "token"
    token.write_text("t")
    port = free_port()
    c = collector_at(tmp_path, port)
    try:
        with fake_api_server() as api:
            kube = config.KubernetesConfig(enabled=True, node_name="node-1", api_server=api,
                                           token_file=str(token))
            rules = (Rule(regex="pod_label_pod_template_hash", action="labeldrop"),)
            with running_agent(agent_cfg(tmp_path, port, w.pid, kubernetes=kube,
                                         relabel=rules, offcpu=False)):
                time.sleep(3)
        labels = stored_samples(c, None)[0][1]
        assert labels["container_id"] == cid
        assert (labels["namespace"], labels["pod"], labels["container"]) == (
            "shop", "checkout-7d9f8b6c5-x2x9q", "checkout")
        assert labels["pod_label_app"] == "checkout"
        assert "pod_label_pod_template_hash" not in labels
    finally:
        c.close()
        w.stop()
        for d in (cg, pod_dir, pod_dir.parent, pod_dir.parent.parent):
            with suppress(OSError):
                d.rmdir()


def test_otlp_export_ground_truth(start_workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """exporters: [otlp] only: the ground-truth workload's profiles reach an
    OTLP ProfilesService (opentelemetry-proto's own servicer), decode, and
    say 35/50/15; nothing goes to the WriteRaw spool."""
    from tests.support.otlp import otlp_server, stacks

    w = start_workload("cpu_shares")
    with otlp_server() as (address, received):
        with running_agent(agent_cfg(tmp_path, free_port(), w.pid, exporters=("otlp",),
                                     otlp_endpoint=address, offcpu=False)) as agent:
            time.sleep(4)
        assert list(agent.exporters) == ["otlp"]  # nothing spooled for WriteRaw
        assert agent.exporters["otlp"].spool.stats()[0] == 0  # all sent
    totals = {"work_a": 0, "work_b": 0, "work_c": 0}
    total = 0
    for req in received.requests:
        for rp in req.resource_profiles:
            attrs = {a.key: a.value for a in rp.resource.attributes}
            assert attrs["process.pid"].int_value == w.pid
            samples_profile = rp.scope_profiles[0].profiles[0]
            for names, value in stacks(req, samples_profile):
                total += value
                for fn in totals:
                    totals[fn] += value if fn in names else 0
    assert total > 100
    for fn, want in (("work_a", 35), ("work_b", 50), ("work_c", 15)):
        assert abs(100 * totals[fn] / total - want) <= 3, totals
