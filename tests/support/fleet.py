"""A fleet of agents' shipping paths in one process: N senders, each with
its own spool and Shipper (ember's own code), putting one WriteRaw request a
second, all on the same second boundaries, for a while; then flushing.

    python -m tests.support.fleet ADDRESS SPOOL_ROOT SENDERS SECONDS FIRST_PID

Prints one JSON line: {"put": ..., "sent": ..., "dropped": ..., "left": ...}.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from ember.export.shipper import Endpoint, Shipper
from ember.export.spool import Spool
from ember.metrics import AgentMetrics
from ember.proto import profilestore_pb2 as ps
from tests.support.collector import series


def main(address: str, root: Path, senders: int, seconds: float, first_pid: int) -> None:
    fleet = []
    for i in range(senders):
        spool = Spool(root / f"agent{i}", 64 << 20)
        metrics = AgentMetrics(CollectorRegistry())
        # no jitter: the worst case, every agent flushing at the same moment
        shipper = Shipper(spool, Endpoint(address, timeout=10), metrics, max_backoff=2.0,
                          base_backoff=0.1)
        fleet.append((spool, metrics, shipper))
        shipper.start()
    put = 0
    start = time.time()
    tick = int(start) + 1
    while tick < start + seconds:
        time.sleep(max(0.0, tick - time.time()))
        for i, (spool, _, _) in enumerate(fleet):
            spool.put(ps.WriteRawRequest(series=[series(first_pid + put + i)])
                      .SerializeToString())
        put += len(fleet)
        tick += 1
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and any(s.stats()[0] for s, _, _ in fleet):
        time.sleep(0.2)
    stoppers = [threading.Thread(target=sh.stop) for _, _, sh in fleet]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join()
    print(json.dumps({
        "put": put,
        "sent": sum(sh.sent for _, _, sh in fleet),
        "dropped": sum(m.spool_dropped._value.get() for _, m, _ in fleet),
        "refused_for_load": sum(m.send_failures.labels("resource_exhausted")._value.get()
                                for _, m, _ in fleet),
        "left": sum(s.stats()[0] for s, _, _ in fleet)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]),
         int(sys.argv[5]))
