"""WriteRaw series: labels, profile ids, executable info, request packing."""

from __future__ import annotations

import itertools
from dataclasses import replace

from ember.encode.pprof import decode_pprof
from ember.encode.writeraw import (
    PROFILE_ID_PREFIX,
    batch_requests,
    encode_requests,
    make_series,
    profiles_in,
)
from ember.model import Profile
from ember.proto import profilestore_pb2 as ps
from tests.support.profiles import cpu_profile

LABELS = {"__name__": "ember_cpu", "host": "h", "pid": "10", "comm": "app"}


def labelled(pid: int = 10) -> Profile:
    return replace(cpu_profile(), start_ns=1, duration_ns=2, labels={**LABELS, "pid": str(pid)})


def test_series_labels_id_and_executable_info() -> None:
    s, pid = make_series(labelled())
    assert {lb.name: lb.value for lb in s.labels.labels} == LABELS
    [sample] = s.samples
    p = decode_pprof(sample.raw_profile)
    assert f"{PROFILE_ID_PREFIX}{pid}" in [p.string_table[c] for c in p.comment]
    assert len(sample.executable_info) == len(p.mapping)
    assert (p.time_nanos, p.duration_nanos) == (1, 2)
    _, pid2 = make_series(labelled())
    assert pid2 != pid


def test_requests_hold_every_profile_and_count_them() -> None:
    profiles = [labelled(pid) for pid in range(10)]
    one = encode_requests(profiles[:1], 1 << 20)[0]
    requests = encode_requests(profiles, 3 * len(one))
    assert len(requests) > 1 and all(len(r) <= 3 * len(one) + 100 for r in requests)
    assert sum(profiles_in(r) for r in requests) == 10
    pids = [lb.value for r in requests for s in ps.WriteRawRequest.FromString(r).series
            for lb in s.labels.labels if lb.name == "pid"]
    assert pids == [str(i) for i in range(10)]
    assert profiles_in(b"not a request") == 0


def test_batches_respect_size() -> None:
    series = [make_series(labelled(i))[0] for i in range(10)]
    # sizes differ by a few bytes (each profile id compresses differently):
    # check the packing itself, not a fixed split
    limit = 3 * series[0].ByteSize() + 30
    reqs = batch_requests(series, limit)
    sizes = [[s.ByteSize() + 8 for s in r.series] for r in reqs]
    assert [s for r in reqs for s in r.series] == series  # all of them, in order
    assert all(sum(b) <= limit or len(b) == 1 for b in sizes)  # none over the limit
    for batch, following in itertools.pairwise(sizes):
        assert sum(batch) + following[0] > limit  # and each batch as full as it can be
    assert 3 <= len(reqs) <= 5
    assert batch_requests([], 100) == []
