"""The query API under arbitrary parameters: whatever a client sends, the
answer is 200, 400 or 404 with a JSON, SVG or profile body, quickly; never
a 500, never an exception (issue 20: out-of-range times answered 500)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.collector.api import Api
from ember.collector.store import Store
from ember.collector.validate import DEFAULT_LIMITS, check_request
from ember.proto import profilestore_pb2 as ps
from tests.support.bounds import no_hang
from tests.support.collector import series

ROUTES = ["/api/v1/profile", "/api/v1/flamegraph", "/api/v1/diff", "/api/v1/top",
          "/api/v1/timeline", "/api/v1/labels", "/api/v1/types", "/api/v1/labels/pid/values"]
NAMES = ["type", "format", "since", "from", "to", "match", "width", "title", "limit",
         "buckets", "normalize"]
NAMES += [side + n for side in ("a_", "b_") for n in ("since", "from", "to", "match")]

now = time.time_ns()
numbers = st.one_of(st.integers(), st.integers(-2**70, 2**70), st.sampled_from(
    [0, 1, -1, 2**63 - 1, 2**63, 2**64, now, now - 10**9, now + 10**12])).map(str)
durations = st.builds(lambda n, unit: f"{n}{unit}",
                      st.one_of(st.integers(0, 10**12), st.sampled_from(["1e300", "0.5", "1."]),
                                st.floats(allow_nan=True).map(str)),
                      st.sampled_from(["us", "ms", "s", "m", "h", "d", "", "y", " h"]))
words = st.sampled_from(["cpu", "offcpu", "hotcold", "wakeup", "folded", "pprof", "json",
                         "svg", "pid=10", "pid=11", "comm=app", "=x", "pid", "0", "false", ""])
values = st.one_of(numbers, durations, words, st.text(max_size=30))
queries = st.dictionaries(st.one_of(st.sampled_from(NAMES), st.text(max_size=8)),
                          st.lists(values, min_size=1, max_size=3), max_size=6)
paths = st.one_of(st.sampled_from(ROUTES), st.text(max_size=20).map("/api/v1/".__add__),
                  st.text(max_size=10).map(lambda t: f"/api/v1/labels/{t}/values"))


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """A small store: two processes on-CPU and one off-CPU, written now."""
    store = Store(Path(tmp_path_factory.mktemp("fuzz")) / "db.sqlite")
    req = ps.WriteRawRequest(series=[series(10), series(11), series(10, "offcpu")])
    store.write(check_request(req, DEFAULT_LIMITS, time.time_ns()))
    yield Api(store)
    store.close()


@settings(max_examples=10_000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(path=paths, query=queries)
def test_any_parameters_answer_200_400_or_404(api: Api, path: str,
                                              query: dict[str, list[str]]) -> None:
    with no_hang((path, query)):
        code, body, ctype = api.handle(path, query)
    assert code in (200, 400, 404), body[:200]
    if ctype == "application/json":
        answer = json.loads(body)
        assert code == 200 or set(answer) == {"error"}
    elif ctype == "image/svg+xml":
        assert code == 200 and b"<svg" in body[:500]
    else:  # a profile in the format asked for
        assert (code, path) == (200, "/api/v1/profile")
        assert ctype.split(";")[0] in ("text/plain", "application/octet-stream"), ctype
