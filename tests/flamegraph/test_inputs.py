"""Stacks from every kind of source: folded text in any unit, pprof files,
standard input, a collector URL; and the helpers diff and hot/cold use."""

from __future__ import annotations

import gzip
import io
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ember.encode.pprof import encode_pprof, to_proto
from ember.errors import UsageError
from ember.flamegraph.inputs import Stacks, as_time, load, load_stream, stacks_of, strip_hex
from ember.httpserve import serve
from ember.runtimes.pycode import PYTHON_MAPPING
from tests.support.net import free_port
from tests.support.profiles import cpu_profile


def test_kind_hints_from_pprof() -> None:
    from ember.model import KERNEL_MAPPING, Frame, FrameKind, Mapping, Sample, cpu_type

    jit = Frame("LazyCompile:*handler", FrameKind.USER, Mapping(1, 2, 0, "[anon]"), 1)
    exe = Frame("main", FrameKind.USER, Mapping(3, 4, 0, "/usr/bin/node"), 3)
    k = Frame("schedule", FrameKind.KERNEL, KERNEL_MAPPING, 5)
    py = Frame("Box.work (app.py:3)", FrameKind.USER, PYTHON_MAPPING, 0x7f00, "Box.work")
    s = stacks_of(cpu_type(99), [Sample((exe, jit, k), (1, 10), 1, 1, "node"),
                                 Sample((exe, py), (1, 10), 1, 1, "python3")])
    assert s.kinds == {"main": "user", "LazyCompile:*handler": "jit", "schedule": "kernel",
                       "Box.work (app.py:3)": "python"}


def test_folded_time_units_and_offcpu_guess(tmp_path: Path) -> None:
    f = tmp_path / "x.folded"
    f.write_text("app;main;[sleeping] 3\napp;main;work 2\n")
    counts = load(str(f))
    assert counts.unit == "samples" and counts.offcpu and counts.total == 5
    ms = load(str(f), "ms")
    assert ms.unit == "ns" and ms.stacks["app;main;work"] == 2_000_000
    assert load(str(f), "ns").stacks == counts.stacks


def test_standard_input(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stdin:
        buffer = io.BytesIO(b"a;b 4\n")

    monkeypatch.setattr(sys, "stdin", Stdin)
    assert load("-").stacks == Counter({"a;b": 4})


@pytest.fixture
def profile_server() -> Iterator[tuple[str, list[dict[str, list[str]]]]]:
    """A collector stand-in serving one pprof profile; records the queries."""
    seen: list[dict[str, list[str]]] = []
    body = encode_pprof(cpu_profile())

    def route(path: str, q: dict[str, list[str]], auth: str) -> tuple[int, bytes, str]:
        seen.append(q)
        if path != "/api/v1/profile":
            return 404, b"{}", "application/json"
        return 200, body, "application/octet-stream"

    server = serve("127.0.0.1:0", route, "test")
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_collector_url_is_fetched_as_pprof(
        profile_server: tuple[str, list[dict[str, list[str]]]]) -> None:
    base, seen = profile_server
    s = load(f"{base}/api/v1/profile?type=cpu&format=folded&match=pid%3D10")
    assert seen == [{"type": ["cpu"], "format": ["pprof"], "match": ["pid=10"]}]
    assert s.unit == "ns" and "main" in s.kinds
    with pytest.raises(UsageError, match="cannot fetch"):
        load(f"{base}/nope")
    with pytest.raises(UsageError, match="cannot fetch"):
        load(f"http://127.0.0.1:{free_port()}/api/v1/profile")


def test_collector_url_with_token_and_ca(tmp_path: Path) -> None:
    body = encode_pprof(cpu_profile())

    def route(path: str, q: dict[str, list[str]], auth: str) -> tuple[int, bytes, str]:
        if auth != "Bearer t0k":
            return 401, b'{"error": "missing or wrong bearer token"}', "application/json"
        return 200, body, "application/octet-stream"

    server = serve("127.0.0.1:0", route, "test")
    url = f"http://127.0.0.1:{server.server_address[1]}/api/v1/profile?type=cpu"
    try:
        assert "main" in load(url, token="t0k").kinds
        with pytest.raises(UsageError, match="answered 401: missing or wrong bearer token"):
            load(url)
        with pytest.raises(UsageError, match="cannot use CA certificate"):
            load(url.replace("http:", "https:"), token="t0k", cafile=str(tmp_path / "no.pem"))
    finally:
        server.shutdown()
        server.server_close()


def test_strip_hex_merges_addresses() -> None:
    assert strip_hex(Counter({"a;0x1f;b": 1, "a;0xAB;b": 2, "a;c": 3})) == Counter(
        {"a;0x?;b": 3, "a;c": 3})


def test_as_time() -> None:
    ns = Stacks(Counter({"a": 5}), "ns", {})
    assert as_time(ns, None, "x") is ns
    counts = Stacks(Counter({"a": 5}), "samples", {"a": "user"}, offcpu=True)
    assert as_time(counts, 100, "x") == Stacks(Counter({"a": 50_000_000}), "ns", {"a": "user"},
                                               offcpu=True)
    with pytest.raises(UsageError, match="give --frequency"):
        as_time(counts, None, "hot.folded")


def test_pprof_strings_not_utf8_are_repaired_not_refused() -> None:
    """Go's pprof writes a symbol's bytes as they are; the protobuf runtime
    refuses such strings. The bad bytes become U+FFFD, every sample stays."""
    data = to_proto(cpu_profile()).SerializeToString()
    assert data.count(b"\x04main") == 1
    bad = data.replace(b"\x04main", b"\x04m\xffin")
    want = load_stream(io.BytesIO(gzip.compress(data)), "good.pb.gz")
    for raw in (bad, gzip.compress(bad)):
        got = load_stream(io.BytesIO(raw), "bad.pb")
        assert got.total == want.total
        assert Counter({k.replace("m\ufffdin", "main"): v for k, v in got.stacks.items()}) \
            == want.stacks
        assert any("m\ufffdin" in k for k in got.stacks)


def test_pprof_broken_elsewhere_is_still_refused() -> None:
    """Strings that are fine and a sample that is not protobuf: no repair
    makes that a profile."""
    broken = b"\x32\x01a" + b"\x12\x02\xff\xff"  # string_table "a", sample of junk
    with pytest.raises(UsageError, match=r"^bad\.pb: neither folded stacks nor a pprof"):
        load_stream(io.BytesIO(gzip.compress(broken)), "bad.pb")
