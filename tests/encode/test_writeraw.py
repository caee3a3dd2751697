"""WriteRaw series: labels, profile ids, executable info, request packing."""

from __future__ import annotations

import itertools

from ember.agent.labels import ProcessLabels, series_labels
from ember.encode.pprof import decode_pprof
from ember.encode.writeraw import PROFILE_ID_PREFIX, batch_requests, make_series
from tests.support.profiles import cpu_profile


def test_series_labels_id_and_executable_info() -> None:
    prof = cpu_profile()
    meta = ProcessLabels(pid=10, comm="app", executable="/usr/bin/app", build_id="abcd")
    s, pid = make_series(prof.type, prof.samples, series_labels(prof.type, meta, {"host": "h"}),
                         1, 2)
    labels = {lb.name: lb.value for lb in s.labels.labels}
    assert labels == {"__name__": "ember_cpu", "host": "h", "pid": "10", "comm": "app",
                      "executable": "/usr/bin/app", "build_id": "abcd"}
    [sample] = s.samples
    p = decode_pprof(sample.raw_profile)
    assert f"{PROFILE_ID_PREFIX}{pid}" in [p.string_table[c] for c in p.comment]
    assert len(sample.executable_info) == len(p.mapping)
    assert (p.time_nanos, p.duration_nanos) == (1, 2)
    _, pid2 = make_series(prof.type, prof.samples, series_labels(prof.type, meta, {}), 1, 2)
    assert pid2 != pid


def test_batches_respect_size() -> None:
    prof = cpu_profile()
    series = [make_series(prof.type, prof.samples,
                          series_labels(prof.type, ProcessLabels(pid=i), {}), 1, 2)[0]
              for i in range(10)]
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
