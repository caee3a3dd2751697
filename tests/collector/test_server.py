"""The collector over real gRPC and SQLite on loopback: valid writes stored
once, bad requests rejected with the collector still serving, auth, TLS,
retention, and the query API."""

from __future__ import annotations

import gzip
import json
import random
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ember.collector.server import Collector
from ember.config import CollectorConfig
from ember.encode.folded import parse_folded
from ember.encode.pprof import decode_pprof
from ember.proto import profile_pb2 as pb
from ember.proto import profilestore_pb2 as ps
from ember.proto import profilestore_pb2_grpc as ps_grpc
from tests.support.collector import series
from tests.support.net import free_port
from tests.support.tls import self_signed


def start(tmp_path: Path, **kw: object) -> Collector:
    cfg = CollectorConfig(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0",
                          storage=str(tmp_path / "db.sqlite"), **kw)  # type: ignore[arg-type]
    c = Collector(cfg)
    c.start()
    return c


@pytest.fixture(params=[0, 1], ids=["in-process", "decode-worker"])
def collector(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Collector]:
    """A collector that reads requests itself, and one whose decode worker
    (a real process) does."""
    c = start(tmp_path, max_request_size=1 << 20, max_profile_size=1 << 20,
              decode_workers=request.param)
    yield c
    c.close()


def stub(c: Collector) -> ps_grpc.ProfileStoreServiceStub:
    return ps_grpc.ProfileStoreServiceStub(grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}"))


def http(c: Collector, path: str, token: str = "") -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{c.http_port}{path}",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_write_query_and_dedup(collector: Collector) -> None:
    req = ps.WriteRawRequest(series=[series(10), series(11), series(10, "offcpu")])
    s = stub(collector)
    s.WriteRaw(req, timeout=10)
    s.WriteRaw(req, timeout=10)  # a re-send after an ambiguous failure
    assert collector.store.count() == 3
    assert collector.metrics.duplicates._value.get() == 3
    code, body = http(collector, "/api/v1/profile?type=cpu&since=1h&format=folded")
    assert code == 200
    folded = parse_folded(body.decode())
    assert folded["app;main;ns::Box<int>::operator()(int) const"] == 20  # 2 processes x 10
    code, body = http(collector, "/api/v1/profile?type=cpu&since=1h&match=pid=11&format=json")
    tree = json.loads(body)["tree"]
    assert tree["value"] == 13 and tree["children"][0]["name"] == "app"
    code, body = http(collector, "/api/v1/profile?type=offcpu&since=1h&format=pprof")
    p = decode_pprof(body)
    assert [list(x.value) for x in p.sample] == [[4, 40_000_123], [1, 2_500]]
    assert json.loads(http(collector, "/api/v1/labels")[1])["labels"] == [
        "__name__", "comm", "host", "pid"]
    assert json.loads(http(collector, "/api/v1/labels/pid/values")[1])["values"] == ["10", "11"]
    assert len(json.loads(http(collector, "/api/v1/types")[1])["types"]) == 2
    assert http(collector, "/api/v1/profile?type=cpu&match=pid=99")[0] == 404
    assert http(collector, "/api/v1/profile?format=svg")[0] == 400
    assert http(collector, "/api/v1/profile?since=never")[0] == 400
    assert http(collector, "/nope")[0] == 404


def bad_profile(mutate: object) -> ps.WriteRawRequest:
    s = series()
    p = decode_pprof(s.samples[0].raw_profile)
    mutate(p)  # type: ignore[operator]
    s.samples[0].raw_profile = gzip.compress(p.SerializeToString())
    del s.samples[0].executable_info[:]
    return ps.WriteRawRequest(series=[s])


def _no_name() -> ps.WriteRawRequest:
    s = series()
    kept = [lb for lb in s.labels.labels if lb.name != "__name__"]
    del s.labels.labels[:]
    s.labels.labels.extend(kept)
    return ps.WriteRawRequest(series=[s])


def _bad_label() -> ps.WriteRawRequest:
    s = series()
    s.labels.labels.add(name="bad-name", value="x")
    return ps.WriteRawRequest(series=[s])


def _gzip_bomb() -> ps.WriteRawRequest:
    s = series()
    s.samples[0].raw_profile = gzip.compress(b"\0" * (8 << 20))
    return ps.WriteRawRequest(series=[s])


def _set(attr: str) -> object:
    def f(p: pb.Profile) -> None:
        if attr == "string0":
            p.string_table[0] = "x"
        elif attr == "mapping_id":
            p.mapping[0].id = 7
        elif attr == "values":
            p.sample[0].value.append(1)
        elif attr == "location0":
            p.sample[0].location_id.append(0)
        elif attr == "label_key0":
            p.sample[0].label.add(key=0, str=1)
        elif attr == "string_range":
            p.function[0].name = 10_000
    return f


@pytest.mark.parametrize(("request_", "message"), [
    (_no_name, "no __name__ label"),
    (_bad_label, "invalid label name 'bad-name'"),
    (_gzip_bomb, "decompresses to more than"),
    (lambda: bad_profile(_set("string0")), "string table must start with the empty string"),
    (lambda: bad_profile(_set("mapping_id")), "mapping 0 has id 7, expected 1"),
    (lambda: bad_profile(_set("values")), "sample 0 has 3 values for 2 sample types"),
    (lambda: bad_profile(_set("location0")), "location id 0 out of range"),
    (lambda: bad_profile(_set("label_key0")), "label key 0"),
    (lambda: bad_profile(_set("string_range")), "string index 10000 out of range"),
])
def test_invalid_requests_rejected(collector: Collector, request_: object, message: str) -> None:
    with pytest.raises(grpc.RpcError) as exc:
        stub(collector).WriteRaw(request_(), timeout=10)  # type: ignore[operator]
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in exc.value.details()
    assert collector.store.count() == 0


def test_garbage_truncated_and_oversized(collector: Collector, tmp_path: Path) -> None:
    channel = grpc.insecure_channel(f"127.0.0.1:{collector.grpc_port}")
    raw = channel.unary_unary("/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw",
                              request_serializer=None, response_deserializer=None)
    good = ps.WriteRawRequest(series=[series()]).SerializeToString()
    rng = random.Random(3)
    for payload in (rng.randbytes(5000), good[: len(good) // 2], b"\xff" * 64):
        with pytest.raises(grpc.RpcError) as exc:
            raw(payload, timeout=10)
        assert exc.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(grpc.RpcError) as exc:
        raw(b"\n" + b"\x80" * 3 + rng.randbytes(2 << 20), timeout=10)  # past max_request_size
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # still serving, and nothing bad was stored
    stub(collector).WriteRaw(ps.WriteRawRequest(series=[series()]), timeout=10)
    assert collector.store.count() == 1
    code, body = http(collector, "/api/v1/profile")
    assert code == 200 and body.strip()


#: A client in its own process (so that only the collector's memory is in
#: this one): N WriteRaw calls of SIZE random bytes at once, printing each
#: call's status code.
_CALLS = """
import sys, random, grpc
from ember.proto import profilestore_pb2 as ps, profilestore_pb2_grpc as g
n, size, port = map(int, sys.argv[1:])
req = ps.WriteRawRequest(series=[ps.RawProfileSeries(samples=[
    ps.RawSample(raw_profile=random.Random(1).randbytes(size))])])
ch = grpc.insecure_channel(f"127.0.0.1:{port}",
                           options=[("grpc.max_send_message_length", 2 * size)])
calls = [g.ProfileStoreServiceStub(ch).WriteRaw.future(req, timeout=60) for _ in range(n)]
print("sent", flush=True)
print(" ".join((c.exception() or grpc.RpcError()).code().name for c in calls))
"""


def _rss_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def test_queued_calls_wait_without_their_requests(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls past the threads that serve them wait in gRPC's queue holding
    no more than their stream's window, not their whole request: 30 calls
    of 4 MB queued behind two blocked threads grow the collector by far
    less than their 120 MB (with the transport's link estimate on, each
    sent all of it), and each is read whole once a thread is free."""
    import ember.collector.server as server
    monkeypatch.setattr(server, "WRITE_THREADS", 2)
    c = start(tmp_path, max_request_size=8 << 20)
    gate, entered = threading.Event(), threading.Semaphore(0)

    def held(header: str) -> bool:
        entered.release()
        gate.wait(60)
        return True

    monkeypatch.setattr(c, "authorized", held)
    client = None
    try:
        before = _rss_mb()
        client = subprocess.Popen([sys.executable, "-c", _CALLS, "32", str(4 << 20),
                                   str(c.grpc_port)], stdout=subprocess.PIPE, text=True)
        assert client.stdout is not None and client.stdout.readline().strip() == "sent"
        for _ in range(2):
            assert entered.acquire(timeout=30)   # both threads hold a call
        time.sleep(2)   # (the queued calls' bytes would have arrived by now)
        grown = _rss_mb() - before
        # two requests being read (8 MB, and their parse) and 30 windows of 256 KB
        assert grown < 40, f"the collector grew by {grown:.0f} MB for 30 queued calls"
        gate.set()
        codes = client.stdout.readline().split()
        assert client.wait(60) == 0
        # every call was taken and its 4 MB read: refused as no profile, not for load
        assert codes == ["INVALID_ARGUMENT"] * 32, codes
    finally:
        gate.set()
        if client is not None and client.poll() is None:
            client.kill()
        c.close()


def test_token_auth(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    c = start(tmp_path, token_file=str(token))
    try:
        req = ps.WriteRawRequest(series=[series()])
        with pytest.raises(grpc.RpcError) as exc:
            stub(c).WriteRaw(req, timeout=10)
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError):
            stub(c).WriteRaw(req, timeout=10, metadata=[("authorization", "Bearer wrong")])
        stub(c).WriteRaw(req, timeout=10, metadata=[("authorization", "Bearer s3cret")])
        assert http(c, "/api/v1/labels")[0] == 401
        assert http(c, "/api/v1/labels", token="s3cret")[0] == 200
        assert http(c, "/healthz")[0] == 200
        # the web UI loads without the token: the page asks a person for it
        assert http(c, "/")[0] == 200 and http(c, "/ui/app.js")[0] == 200
    finally:
        c.close()


def interned(c: Collector) -> dict[str, float]:
    """ember_collector_interned by table, as /metrics shows it."""
    code, body = http(c, "/metrics")
    assert code == 200
    return {table: float(v) for table, v in re.findall(
        r'^ember_collector_interned\{table="(\w+)"\} (\S+)$', body.decode(), re.M)}


def test_retention_by_age_and_size(tmp_path: Path) -> None:
    c = start(tmp_path, retention=60.0)
    try:
        old = series()
        p = decode_pprof(old.samples[0].raw_profile)
        p.time_nanos = 1_000_000_000  # 1970
        old.samples[0].raw_profile = gzip.compress(p.SerializeToString())
        stub(c).WriteRaw(ps.WriteRawRequest(series=[old, series(12)]), timeout=10)
        assert c.store.count() == 2
        before = interned(c)
        assert before["series"] == 2 and before["threads"] == 2   # (both pid 10's tids 11, 12)
        c.retention_once()
        assert c.store.count() == 1
        # the old series is forgotten; its threads are the new profile's too
        assert interned(c) == {**before, "series": 1}
        assert c.store.enforce_retention(3600, max_bytes=1) == (0, 1)
        assert c.store.count() == 0
        # stacks, frames and leaves stay (collector/garbage.py)
        assert interned(c) == {**before, "series": 0, "threads": 0}
    finally:
        c.close()


@pytest.mark.skipif(not Path("/usr/bin/openssl").exists(), reason="openssl not installed")
def test_tls_grpc_and_https_query(tmp_path: Path) -> None:
    key, cert = self_signed(tmp_path)
    token = tmp_path / "token"
    token.write_text("t0k")
    c = start(tmp_path, tls_cert=str(cert), tls_key=str(key), token_file=str(token))
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        s = ps_grpc.ProfileStoreServiceStub(
            grpc.secure_channel(f"127.0.0.1:{c.grpc_port}", creds))
        s.WriteRaw(ps.WriteRawRequest(series=[series()]), timeout=10,
                   metadata=[("authorization", "Bearer t0k")])
        r = subprocess.run([sys.executable, "-m", "ember.cli", "query", "--collector",
                            f"https://127.0.0.1:{c.http_port}", "--ca", str(cert),
                            "--token-file", str(token)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "ns::Box<int>::operator()(int) const" in r.stdout
        # the agent's own shipper, over TLS with a token
        from prometheus_client import CollectorRegistry

        from ember.export.shipper import Endpoint, Shipper
        from ember.export.spool import Spool
        from ember.metrics import AgentMetrics
        spool = Spool(tmp_path / "spool", 1 << 20)
        spool.put(ps.WriteRawRequest(series=[series(77)]).SerializeToString())
        shipper = Shipper(spool, Endpoint(f"127.0.0.1:{c.grpc_port}", token="t0k",
                                          tls_ca=cert.read_bytes()),
                          AgentMetrics(CollectorRegistry()))
        item = spool.oldest()
        assert item is not None and shipper.send_one(item)
        assert c.store.label_values("pid") == ["10", "77"]
        insecure = grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}")
        with pytest.raises(grpc.RpcError):
            ps_grpc.ProfileStoreServiceStub(insecure).WriteRaw(ps.WriteRawRequest(), timeout=5)
    finally:
        c.close()


def test_a_second_collector_on_the_grpc_port_exits_2(tmp_path: Path) -> None:
    """gRPC's SO_REUSEPORT would let it bind and take half the writes."""
    first = Collector(CollectorConfig(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0",
                                      storage=str(tmp_path / "a.sqlite")))
    first.start()
    try:
        r = subprocess.run([sys.executable, "-m", "ember.cli", "collector", "--grpc-listen",
                            f"127.0.0.1:{first.grpc_port}", "--http-listen",
                            f"127.0.0.1:{free_port()}", "--storage", str(tmp_path / "b.sqlite")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert (f"collector.grpc_listen 127.0.0.1:{first.grpc_port}: cannot listen: "
                "Address already in use") in r.stderr
        assert "Traceback" not in r.stderr
    finally:
        first.close()


def test_the_help_of_max_concurrent_writes_states_the_server_s_own_figures() -> None:
    """The config schema cannot import the collector: its help repeats the
    threads serving calls and a waiting call's window, and must keep up."""
    from ember.collector.server import WAITING_WINDOW, WRITE_THREADS
    from ember.config.options import keys_of
    doc = next(k.option.doc for k in keys_of(CollectorConfig)
               if k.name == "max_concurrent_writes")
    assert f"{WRITE_THREADS} calls are served at once" in doc
    assert f"holds at most {WAITING_WINDOW >> 10} KB" in doc


def test_load_refusals_are_counted_only_where_grpc_shows_its_calls_in_hand() -> None:
    from ember.collector.server import _LoadRefusals
    refused: list[int] = []
    counter = _LoadRefusals(lambda: refused.append(1))

    class State:
        active_rpc_count, maximum_concurrent_rpcs = 3, 3

    class Server:
        _state = State()

    assert not counter.watch(object())   # (another gRPC: nothing read, nothing counted)
    counter.intercept_service(lambda d: d, None)
    assert refused == []
    assert counter.watch(Server())
    counter.intercept_service(lambda d: d, None)         # 3 in hand of 3: refused
    Server._state.active_rpc_count = 2
    counter.intercept_service(lambda d: d, None)         # 2 of 3: served
    assert refused == [1]
