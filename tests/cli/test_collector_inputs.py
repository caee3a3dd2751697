"""``ember query``, ``ember flamegraph`` and ``ember diff`` reading from a real
collector that wants a token and speaks TLS, as the Kubernetes manifests run
it: --token-file and --ca reach the request, and a missing one is a clear
error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ember.collector.server import Collector
from ember.collector.validate import check_request
from ember.config import CollectorConfig
from ember.encode.folded import parse_folded
from ember.proto import profilestore_pb2 as ps
from tests.support.collector import series
from tests.support.profiles import cpu_profile
from tests.support.svg import frames

pytestmark = pytest.mark.skipif(not Path("/usr/bin/openssl").exists(),
                                reason="openssl not installed")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ember.cli", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """(https base URL, --token-file/--ca arguments) of a filled collector."""
    key, cert, token = tmp_path / "key.pem", tmp_path / "cert.pem", tmp_path / "token"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    token.write_text("cl1-t0ken\n")
    c = Collector(CollectorConfig(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0",
                                  storage=str(tmp_path / "db.sqlite"), token_file=str(token),
                                  tls_cert=str(cert), tls_key=str(key)))
    req = ps.WriteRawRequest(series=[series(10), series(11), series(10, "offcpu")])
    c.store.write(check_request(req, c.limits, time.time_ns()))
    c.start()
    yield f"https://127.0.0.1:{c.http_port}", ["--token-file", str(token), "--ca", str(cert)]
    c.close()


def test_flamegraph_and_hot_cold_from_the_collector(collector: tuple[str, list[str]],
                                                    tmp_path: Path) -> None:
    base, access = collector
    cpu, off = f"{base}/api/v1/profile?type=cpu", f"{base}/api/v1/profile?type=offcpu"
    r = run("flamegraph", cpu, *access)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "main" in {f["name"] for f in frames(r.stdout)}
    out = tmp_path / "hc.svg"
    r = run("flamegraph", cpu, "--cold", off, *access, "-o", str(out))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    names = {f["name"] for f in frames(out.read_text())}
    assert {"main", "[sleeping]"} <= names


def test_diff_from_the_collector(collector: tuple[str, list[str]], tmp_path: Path) -> None:
    base, access = collector
    before = f"{base}/api/v1/profile?type=cpu&match=pid%3D10"
    after = f"{base}/api/v1/profile?type=cpu&match=pid%3D11"
    r = run("diff", before, after, *access, "--folded", str(tmp_path / "two.txt"))
    assert r.returncode == 0, r.stderr
    assert "Differential Flame Graph" in r.stdout
    assert (tmp_path / "two.txt").read_text().strip()


def test_without_token_or_ca_a_clear_error(collector: tuple[str, list[str]],
                                           tmp_path: Path) -> None:
    base, (_, token, _, ca) = collector
    url = f"{base}/api/v1/profile?type=cpu"
    r = run("flamegraph", url, "--ca", ca)
    assert r.returncode == 2
    assert r.stderr == (f"ember flamegraph: cannot fetch {url}: collector answered 401: "
                        "missing or wrong bearer token\n")
    r = run("diff", url, url, "--token-file", token)
    assert r.returncode == 2 and "CERTIFICATE_VERIFY_FAILED" in r.stderr, r.stderr
    r = run("diff", url, url, "--ca", ca, "--token-file", str(tmp_path / "none"))
    assert r.returncode == 2 and "cannot read token file" in r.stderr, r.stderr


def test_query_with_token_file_and_ca(collector: tuple[str, list[str]], tmp_path: Path) -> None:
    base, access = collector
    out = tmp_path / "q.folded"
    r = run("query", "--collector", base, "--match", "pid=11", *access, "-o", str(out))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    folded = parse_folded(out.read_text())
    # what the collector was given for pid 11: its samples, whatever the stacks
    assert sum(folded.values()) == cpu_profile().total(0)
    assert {s.frames[-1].name for s in cpu_profile().samples} == \
        {stack.split(";")[-1] for stack in folded}
    r = run("query", "--collector", base, "--ca", access[3])
    assert r.returncode == 1
    assert r.stderr == "ember query: collector answered 401: missing or wrong bearer token\n"
    r = run("query", "--collector", base, "--token-file", access[1])
    assert r.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in r.stderr
    assert len(r.stderr.splitlines()) == 1
    plain = base.replace("https://", "http://")  # http to the TLS port: one line too
    r = run("query", "--collector", plain, *access)
    assert r.returncode == 1 and r.stderr.startswith(f"ember query: cannot reach {plain}: ")
    assert len(r.stderr.splitlines()) == 1
