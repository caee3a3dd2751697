"""Each exporter against its backend's own definitions: the upstream protos
(tests/export/protos/, compiled here with grpcio-tools; OTLP's from the
opentelemetry-proto package) make a gRPC server in a process of its own
(upstream_receiver.py); ember's real exporter and shipper send to it, and
what arrived, decoded with the upstream definitions, must carry the
profiles' samples, values, function names, lines and labels."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from ember.config import AgentConfig
from ember.export.exporter import exporters
from ember.metrics import AgentMetrics
from ember.model import Frame, FrameKind, Profile, Sample
from tests.support.profiles import EXE, MAIN, cpu_profile, offcpu_profile
from tests.support.waits import wait_for

HERE = Path(__file__).parent
PROTOS = HERE / "protos"
#: Options that only annotate HTTP gateways and OpenAPI documents; their
#: imports are not vendored (protos/README.md), so they are stripped.
_DOC_OPTION = re.compile(
    r"option\s*\((?:gnostic|google\.api)\.[^)]*\)[^;{]*(?:\{[^}]*\})?\s*;"
    r"|\s*\[\((?:gnostic|google\.api)\.[^\]]*\]"
    r'|import\s+"(?:gnostic|google/api)/[^"]*";')
UPSTREAM = {"pyroscope": ("pyroscope", ["push/v1/push.proto", "types/v1/types.proto"]),
            "writeraw": ("parca", ["parca/profilestore/v1alpha1/profilestore.proto"])}

# A frame with a source line, and a function inlined into it at its address.
INLINER = Frame("handle", FrameKind.USER, EXE, 0x400300, file="app.c", line=42)
INLINED = Frame("parse", FrameKind.USER, EXE, 0x400300, file="parse.h", line=7, inlined=True)
LABELS = {"__name__": "ember_cpu", "host": "node-1", "pid": "10", "comm": "app",
          "namespace": "shop", "pod": "cart-7", "container": "cart"}


def strip_doc_options(text: str) -> str:
    return _DOC_OPTION.sub("", text)


def test_stripping_leaves_every_message_and_field() -> None:
    push = (PROTOS / "pyroscope/push/v1/push.proto").read_text()
    stripped = strip_doc_options(push)
    assert "gnostic" not in stripped and "example" not in stripped
    fields = r"\b\w+ \w+ = \d+"
    assert re.findall(fields, stripped) == re.findall(fields, push)
    store = strip_doc_options(
        (PROTOS / "parca/parca/profilestore/v1alpha1/profilestore.proto").read_text())
    assert "google.api" not in store and "rpc WriteRaw(WriteRawRequest)" in store


def compile_upstream(wire: str, out: Path) -> None:
    """The upstream protos of a wire (and pprof's), stripped of their
    documentation options, compiled into out."""
    pytest.importorskip("grpc_tools")
    import grpc_tools

    src = out / "src"
    for root, files in [("pprof", ["profile.proto"]), UPSTREAM[wire]]:
        for name in files:
            dest = src / root / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(strip_doc_options((PROTOS / root / name).read_text()))
        include = Path(grpc_tools.__file__).parent / "_proto"
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{src / root}",
                        f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}",
                        *files], check=True)
    shutil.rmtree(src)


@pytest.fixture(params=["pyroscope", "writeraw", "otlp"])
def receiver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, int, Path]]:
    """(wire, port, file of received requests) of a running upstream receiver."""
    wire: str = request.param
    generated = tmp_path / "generated"
    generated.mkdir()
    if wire in UPSTREAM:
        compile_upstream(wire, generated)
    output = tmp_path / "received.jsonl"
    proc = subprocess.Popen([sys.executable, str(HERE / "upstream_receiver.py"), wire,
                             str(generated), str(output)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield wire, port, output
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def profiles() -> list[Profile]:
    cpu = cpu_profile()
    cpu = replace(cpu, labels=LABELS, samples=(
        *cpu.samples, Sample((MAIN, INLINER, INLINED), (5, 50_000_000), 10, 13, "worker")))
    off = replace(offcpu_profile(), labels={**LABELS, "__name__": "ember_offcpu"})
    return [cpu, off]


def send(wire: str, port: int, output: Path, tmp_path: Path) -> list[dict[str, Any]]:
    """The profiles through ember's exporter for the wire, as received."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    address = f"127.0.0.1:{port}"
    cfg = AgentConfig(spool_dir=str(tmp_path / "spool"), exporters=(wire,),
                      collector=address, otlp_endpoint=address, pyroscope_endpoint=address,
                      token_file=str(token), otlp_token_file=str(token),
                      pyroscope_token_file=str(token), pyroscope_tenant_id="team-a")
    metrics = AgentMetrics(CollectorRegistry())
    exporter = exporters(cfg, metrics)[wire]
    exporter.export(profiles())
    exporter.shipper.start()
    try:
        assert wait_for(lambda: exporter.spool.stats()[0] == 0, timeout=20), \
            exporter.shipper.last_error
    finally:
        exporter.shipper.stop()
    return [json.loads(line) for line in output.read_text().splitlines()]


def pprof_view(p: dict[str, Any]) -> tuple[dict[str, int], set[str], set[tuple[str, int]],
                                           list[int]]:
    """Of a decoded pprof: the total of each sample type, the function names,
    (function, line) pairs, and how many lines each location has."""
    s = p["string_table"]
    types = [s[int(t["type"])] for t in p["sample_type"]]
    totals = {t: sum(int(x["value"][i]) for x in p["sample"]) for i, t in enumerate(types)}
    functions = {f["id"]: s[int(f.get("name", 0))] for f in p["function"]}
    lines = {(functions[ln["function_id"]], int(ln.get("line", 0)))
             for loc in p["location"] for ln in loc.get("line", [])}
    return totals, set(functions.values()), lines, [len(loc.get("line", []))
                                                    for loc in p["location"]]


def check_pprof(p: dict[str, Any], source: Profile) -> None:
    totals, names, _, _ = pprof_view(p)
    assert totals == {t: source.total(i) for i, (t, _) in enumerate(source.type.sample_types)}
    assert {f.name for s in source.samples for f in s.frames} <= names


def test_upstream_receiver_decodes_what_ember_sends(receiver: tuple[str, int, Path],
                                                     tmp_path: Path) -> None:
    wire, port, output = receiver
    received = send(wire, port, output, tmp_path)
    cpu, off = profiles()
    assert len(received) == 1
    got = received[0]
    if wire == "otlp":
        check_otlp(got["request"], cpu, off)
        assert got["metadata"]["authorization"] == "Bearer s3cret"
        return
    assert got["metadata"]["authorization"] == "Bearer s3cret"
    series = got["request"]["series"]
    assert len(series) == 2 and len(got["pprof"]) == 2
    for p, source in zip(got["pprof"], (cpu, off), strict=True):
        check_pprof(p, source)
    _, _, lines, per_location = pprof_view(got["pprof"][0])
    assert {("handle", 42), ("parse", 7)} <= lines and 2 in per_location
    if wire == "pyroscope":
        assert got["metadata"]["x-scope-orgid"] == "team-a"
        labels = [{lb["name"]: lb["value"] for lb in s["labels"]} for s in series]
        names = [[lb["name"] for lb in s["labels"]] for s in series]
        assert all(n == sorted(n) for n in names)
        assert [lb["__name__"] for lb in labels] == ["process_cpu", "off_cpu"]
        assert all(lb["service_name"] == "shop/cart" and lb["pod"] == "cart-7"
                   and lb["host"] == "node-1" for lb in labels)
        ids = [sample["ID"] for s in series for sample in s["samples"]]
        assert len(set(ids)) == 2 and all(re.fullmatch(r"[0-9a-f-]{36}", i) for i in ids)
    else:
        labels = [{lb["name"]: lb["value"] for lb in s["labels"]["labels"]} for s in series]
        assert [lb["__name__"] for lb in labels] == ["ember_cpu", "ember_offcpu"]
        assert all(lb["pod"] == "cart-7" and lb["comm"] == "app" for lb in labels)


def check_otlp(req: dict[str, Any], cpu: Profile, off: Profile) -> None:
    d = req["dictionary"]
    s = d["string_table"]
    attrs = [(s[int(a.get("key_strindex", 0))], a.get("value", {}).get("string_value"))
             for a in d["attribute_table"]]
    functions = [s[int(f.get("name_strindex", 0))] for f in d["function_table"]]
    for rp, source in zip(req["resource_profiles"], (cpu, off), strict=True):
        resource = {a["key"]: a["value"] for a in rp["resource"]["attributes"]}
        assert resource["k8s.pod.name"] == {"string_value": "cart-7"}
        assert resource["process.pid"] == {"int_value": "10"}
        profs = rp["scope_profiles"][0]["profiles"]
        assert len(profs) == len(source.type.sample_types)
        for prof, (vtype, unit) in zip(profs, source.type.sample_types, strict=True):
            assert (s[int(prof["sample_type"]["type_strindex"])],
                    s[int(prof["sample_type"]["unit_strindex"])]) == (vtype, unit)
            i = source.type.sample_types.index((vtype, unit))
            assert sum(int(v) for x in prof["samples"] for v in x["values"]) == source.total(i)
            for x in prof["samples"]:
                names = {attrs[int(a)][0] for a in x["attribute_indices"]}
                assert {"thread.id", "thread.name"} <= names
    assert {f.name for p in (cpu, off) for x in p.samples for f in x.frames} <= set(functions)
    inlined = [loc for loc in d["location_table"] if len(loc.get("lines", [])) == 2]
    assert inlined, "the inlined function shares its caller's location"
    lines = {(functions[int(ln.get("function_index", 0))], int(ln.get("line", 0)))
             for ln in inlined[0]["lines"]}
    assert lines == {("handle", 42), ("parse", 7)}
