"""Hostile writes against a real collector process: a 1 MB request of gzip
members that inflate to gigabytes is refused with the collector's memory
bounded and its queries answering; a 5,000-frame stack is stored and
served as a flame graph, JSON and pprof."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ember.encode.pprof import decode_pprof
from ember.model import MAX_STACK_DEPTH, TRUNCATED
from ember.proto import profile_pb2 as pb
from ember.proto import profilestore_pb2 as ps
from ember.proto import profilestore_pb2_grpc as ps_grpc
from tests.support.collector import series
from tests.support.net import free_port


class Running:
    def __init__(self, proc: subprocess.Popen[str], grpc_port: int, http_port: int):
        self.proc, self.grpc_port, self.http_port = proc, grpc_port, http_port

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}",
                                        timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def write(self, *series_: ps.RawProfileSeries) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}") as ch:
            ps_grpc.ProfileStoreServiceStub(ch).WriteRaw(  # type: ignore[no-untyped-call]
                ps.WriteRawRequest(series=list(series_)), timeout=30)

    def peak_rss(self) -> int:
        """The collector's peak resident memory (VmHWM), bytes."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM")


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Running]:
    grpc_port, http_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ember.cli", "collector", "--grpc-listen",
         f"127.0.0.1:{grpc_port}", "--http-listen", f"127.0.0.1:{http_port}",
         "--storage", str(tmp_path / "db.sqlite")], stderr=subprocess.PIPE, text=True)
    running = Running(proc, grpc_port, http_port)
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline and proc.poll() is None, "collector did not start"
        try:
            if running.get("/healthz")[0] == 200:
                break
        except OSError:  # not listening yet
            time.sleep(0.1)
    yield running
    proc.terminate()
    proc.wait(timeout=30)


def test_a_multi_member_bomb_is_refused_and_queries_answer(collector: Running) -> None:
    collector.write(series(1))
    bomb = series(2)
    bomb.samples[0].raw_profile += gzip.compress(b"\0" * (8 << 20)) * 128  # 1 GiB inflated
    assert len(bomb.SerializeToString()) < 1_100_000
    with pytest.raises(grpc.RpcError) as info:
        collector.write(bomb)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "decompresses to more than" in info.value.details()  # type: ignore[attr-defined]
    for path in ("/api/v1/profile?since=1h", "/api/v1/profile?since=1h&format=json",
                 "/api/v1/flamegraph?since=1h", "/api/v1/top?since=1h"):
        code, _ = collector.get(path)
        assert code == 200, path
    print(f"collector peak RSS {collector.peak_rss() / 2**20:.0f} MiB")
    assert collector.peak_rss() < 300 << 20, collector.peak_rss()


def deep_profile(depth: int) -> bytes:
    """A pprof whose one sample is ``depth`` distinct functions deep."""
    p = pb.Profile(string_table=["", "samples", "count", "cpu", "nanoseconds"])
    p.sample_type.add(type=1, unit=2)
    p.sample_type.add(type=3, unit=4)
    p.period_type.type, p.period_type.unit, p.period = 3, 4, 10_000_000
    p.time_nanos, p.duration_nanos = time.time_ns() - 10**9, 10**9
    for i in range(depth):
        p.string_table.append(f"f{i}")
        p.function.add(id=i + 1, name=len(p.string_table) - 1)
        loc = p.location.add(id=i + 1)
        loc.line.add(function_id=i + 1)
    # leaf first: f{depth-1} is the leaf, f0 the root
    p.sample.add(location_id=list(range(depth, 0, -1)), value=[1, 10_000_000])
    return gzip.compress(p.SerializeToString())


def test_a_5000_frame_stack_is_served(collector: Running) -> None:
    s = series(3)
    s.samples[0].raw_profile = deep_profile(5000)
    del s.samples[0].executable_info[:]
    collector.write(s)
    code, svg = collector.get("/api/v1/flamegraph?since=1h")
    assert code == 200
    names = {t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}title")}
    assert any(n and n.startswith("f4999 ") for n in names)  # the leaf stays
    assert any(n and n.startswith(f"{TRUNCATED} ") for n in names)
    code, body = collector.get("/api/v1/profile?since=1h&format=json")
    assert code == 200
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # the tree nests as deep as the stack
    try:
        node = json.loads(body)["tree"]
    finally:
        sys.setrecursionlimit(limit)
    depth = 0
    while node["children"]:
        node, depth = node["children"][0], depth + 1
    assert node["name"] == "f4999" and depth <= MAX_STACK_DEPTH + 3
    code, raw = collector.get("/api/v1/profile?since=1h&format=pprof")
    assert code == 200
    p = decode_pprof(raw)
    deepest = max(len(x.location_id) for x in p.sample)
    assert deepest == MAX_STACK_DEPTH
    code, folded = collector.get("/api/v1/profile?since=1h")
    assert code == 200 and folded.decode().rstrip().endswith("f4999 1")
