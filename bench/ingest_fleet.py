#!/usr/bin/env python3
"""A simulated fleet writing to a real collector: --hosts agents each send a
--stacks-stack on-CPU profile every --interval seconds (1,000 hosts every
10 s: 100 profiles a second), for --seconds, open loop.

Each host runs one of --programs programs (3,000 stacks over 5,000
functions each) and sends WriteRaw requests as ember's agent makes them
(gzip pprof, a unique profile id, the host's labels). Requests go out at
their scheduled times whether or not the ones before were answered, so a
collector that falls behind shows it as acknowledgement latency (measured
from the scheduled time) and as refusals, not as a slower client.

Reported: acknowledgements (p50, p99, max), requests refused and why, the
rate achieved, the collector's CPU (cores busy) and peak RSS (with its
decode workers: summed, and as PSS, each shared page counted once), the
machine's speed before and after (``read_ms``), per window
of --window seconds (acknowledgements by when they were due, the
collector's RSS as sampled in it) and over the whole run.

    .venv/bin/python bench/ingest_fleet.py [--hosts 1000] [--interval 10]
        [--seconds 300] [--stacks 1000] [--store PATH] [--decode-workers N]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import grpc

from common import EMBER, cpu_seconds, free_port, metric, pss_kb, render, status_kb
from ember.agent.labels import ProcessLabels, series_labels
from ember.collector import workers
from ember.collector.validate import DEFAULT_LIMITS, decompress
from ember.encode.writeraw import PROFILE_ID_PREFIX, make_series
from ember.model import Frame, FrameKind, Mapping, Profile, Sample, cpu_type
from ember.proto import profile_pb2 as pb
from ember.proto import profilestore_pb2 as ps
from ember.proto.profilestore_pb2_grpc import ProfileStoreServiceStub

BASES_PER_PROGRAM = 8  # distinct sample draws per program, reused with new ids


def program_bases(program: int, stacks: int, rng: random.Random
                  ) -> list[tuple[bytes, int, ps.ExecutableInfo]]:
    """Pprof profiles of one program (no profile id yet), deflated once here:
    (a gzip body to go on, strings in its table, executable info)."""
    exe = Mapping(0x400000, 0x4000000, 0, f"/usr/bin/service-{program}", f"c0ffee{program:02x}")
    frames = [Frame(f"svc{program}::module{i % 97}::function_{i}", FrameKind.USER, exe,
                    0x400000 + 64 * i) for i in range(5000)]
    pool = [tuple(rng.choice(frames) for _ in range(rng.randint(8, 30))) for _ in range(3000)]
    out = []
    for _ in range(BASES_PER_PROGRAM):
        samples = tuple(Sample(rng.choice(pool), (rng.randint(1, 9), 10**7), 100,
                               100 + rng.randint(0, 3), f"worker-{rng.randint(0, 3)}")
                        for _ in range(stacks))
        series, _ = make_series(Profile(cpu_type(99), samples, 0, 10**10))
        p = pb.Profile.FromString(decompress(series.samples[0].raw_profile, 1 << 30)[0])
        del p.comment[:]
        out.append((GzipBody.of(p.SerializeToString()), len(p.string_table),
                    series.samples[0].executable_info[0]))
    return out


class GzipBody(NamedTuple):
    """Data deflated up to a flush point, to be ended by ``member``."""

    deflated: bytes
    crc: int
    size: int

    @classmethod
    def of(cls, data: bytes) -> GzipBody:
        c = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS)
        return cls(c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH), zlib.crc32(data), len(data))

    def member(self, tail: bytes) -> bytes:
        """One gzip member of the data and then ``tail``: the data's deflate
        blocks (none final; the sync flush ends them on a byte), the tail's
        (which refer to nothing before them), one CRC over both. What the
        collector receives is the single member an agent sends, and the
        client deflates a few dozen bytes, not the profile."""
        c = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS)
        end = c.compress(tail) + c.flush()
        return (GZIP_HEADER + self.deflated + end
                + struct.pack("<II", zlib.crc32(tail, self.crc), (self.size + len(tail)) % 2**32))


GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\xff"  # deflate, no name, mtime 0


def request(base: tuple[GzipBody, int, ps.ExecutableInfo], labels: dict[str, str],
            at_ns: int) -> ps.WriteRawRequest:
    """``base`` with a new profile id and times (fields appended to a
    serialized message add to its lists and replace its scalars)."""
    body, n_strings, info = base
    tail = pb.Profile(string_table=[PROFILE_ID_PREFIX + uuid.uuid4().hex],
                      comment=[n_strings], time_nanos=at_ns - 10**10,
                      duration_nanos=10**10).SerializeToString()
    series = ps.RawProfileSeries(labels=ps.LabelSet(labels=[
        ps.Label(name=k, value=v) for k, v in sorted(labels.items())]))
    sample = series.samples.add(raw_profile=body.member(tail))
    sample.executable_info.append(info)
    return ps.WriteRawRequest(series=[series])


def family(pid: int) -> list[int]:
    """``pid`` and its descendants (the collector's decode workers)."""
    out, i = [pid], 0
    while i < len(out):
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{out[i]}/task").iterdir():
                out += [int(c) for c in (task / "children").read_text().split()]
        i += 1
    return out


def total(pids: list[int], what: Callable[[int], float]) -> float:
    got = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            got += what(pid)
    return got


def read_ms(bases: list[list[tuple[GzipBody, int, ps.ExecutableInfo]]],
            hosts: list[tuple[int, dict[str, str]]], times: int = 40) -> float:
    """This machine's speed right now: the median CPU ms of reading one
    request here as a decode worker does (decompress, check, intern), its
    program known. A shared host's neighbours slow this and the collector
    together (one probe's runs: 8 ms of collector CPU a profile in one
    hour, 13-15 in another), so a run's figures are read beside it."""
    took = []
    learn = [(prog, base) for prog in range(len(bases)) for base in range(BASES_PER_PROGRAM)]
    for k in range(len(learn) + times):   # (every base of every program read once first)
        prog, base = learn[k] if k < len(learn) else (k % len(bases), k % BASES_PER_PROGRAM)
        data = request(bases[prog][base], hosts[prog][1], time.time_ns()).SerializeToString()
        began = time.thread_time()
        workers.prepare(data, DEFAULT_LIMITS, time.time_ns())
        if k >= len(learn):
            took.append(time.thread_time() - began)
    return statistics.median(took) * 1e3


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * q))] if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--stacks", type=int, default=1000, help="samples in each profile")
    ap.add_argument("--programs", type=int, default=10)
    ap.add_argument("--window", type=float, default=30)
    ap.add_argument("--store", type=Path, help="an existing store to write into (else empty)")
    ap.add_argument("--decode-workers", type=int, default=0,
                    help="the collector's decode_workers (0: it reads requests itself)")
    ap.add_argument("--max-concurrent-writes", type=int,
                    help="the collector's max_concurrent_writes (else its default)")
    args = ap.parse_args()
    rng = random.Random(7)
    print(f"making {args.programs} programs' profiles", file=sys.stderr)
    bases = [program_bases(i, args.stacks, rng) for i in range(args.programs)]
    hosts = []
    for h in range(args.hosts):
        prog = h % args.programs
        p = Profile(cpu_type(99), (), 0, 10**10)
        labels = series_labels(p.type, ProcessLabels(pid=100 + h % 50, comm=f"service-{prog}"),
                               {"host": f"host-{h:04d}"})
        hosts.append((prog, replace(p, labels=labels).labels))
    rate = args.hosts / args.interval
    speed_before = read_ms(bases, hosts)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.store or Path(tmp) / "store.duckdb"
        port, grpc_port = free_port(), free_port()
        conf = Path(tmp) / "ember.yaml"
        conf.write_text(f"collector:\n  decode_workers: {args.decode_workers}\n" + (
            f"  max_concurrent_writes: {args.max_concurrent_writes}\n"
            if args.max_concurrent_writes else ""))
        proc = subprocess.Popen([*EMBER, "collector", "--config", str(conf),
                                 "--storage", str(path),
                                 "--http-listen", f"127.0.0.1:{port}",
                                 "--grpc-listen", f"127.0.0.1:{grpc_port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=[
            ("grpc.max_send_message_length", 64 << 20)])
        stub = ProfileStoreServiceStub(channel)
        grpc.channel_ready_future(channel).result(timeout=120)
        lock = threading.Lock()
        acks: list[tuple[float, float]] = []  # (due, latency)
        refused: Counter[str] = Counter()
        sent = 0
        pending = threading.Semaphore(0)
        peak = peak_all = peak_pss = 0
        stop = threading.Event()

        rss: list[tuple[float, int]] = []  # (when, the collector's RSS in kB)

        def watch() -> None:
            nonlocal peak, peak_all, peak_pss
            while not stop.wait(0.2):
                main = status_kb(proc.pid, "VmRSS")
                rss.append((time.monotonic(), main))
                peak = max(peak, main)
                pids = family(proc.pid)
                peak_all = max(peak_all, int(total(pids, lambda p: status_kb(p, "VmRSS"))))
                peak_pss = max(peak_pss, int(total(pids, pss_kb)))
        threading.Thread(target=watch, daemon=True).start()

        def done(fut: grpc.Future, due: float) -> None:
            now = time.monotonic()
            err = fut.exception()
            with lock:
                if err is None:
                    acks.append((due, now - due))
                else:
                    refused[err.code().name] += 1  # type: ignore[attr-defined]
            pending.release()

        print(f"writing {rate:g} profiles/s for {args.seconds:g} s", file=sys.stderr)
        cpu0, own0 = total(family(proc.pid), cpu_seconds), time.process_time()
        main0 = cpu_seconds(proc.pid)
        began = time.monotonic()
        order = list(range(args.hosts))
        rng.shuffle(order)
        k = 0
        try:
            while True:
                due = began + k / rate
                if due >= began + args.seconds:
                    break
                time.sleep(max(0.0, due - time.monotonic()))
                prog, labels = hosts[order[k % args.hosts]]
                req = request(bases[prog][k % BASES_PER_PROGRAM], labels, time.time_ns())
                fut = stub.WriteRaw.future(req, timeout=60)
                fut.add_done_callback(lambda f, d=due: done(f, d))
                sent += 1
                k += 1
            for _ in range(sent):
                pending.acquire(timeout=120)
            elapsed = time.monotonic() - began
            cpu = total(family(proc.pid), cpu_seconds) - cpu0
            main_cpu = cpu_seconds(proc.pid) - main0
            own = time.process_time() - own0
            # what the seal loop did beside the writes (a block closes every 5 min)
            sealed = metric(port, "ember_collector_blocks_sealed_total")
            grouped = metric(port, "ember_collector_rows_clustered_total")
        finally:
            stop.set()
            proc.terminate()
            proc.wait(60)
        speed_after = read_ms(bases, hosts)
        rows = []
        t = 0.0
        while t < args.seconds:
            lat = [x for d, x in acks if t <= d - began < t + args.window]
            held = [kb for at, kb in rss if t <= at - began < t + args.window]
            rows.append([f"{t:.0f}-{t + args.window:.0f}", str(len(lat)),
                         f"{pct(lat, 0.5) * 1000:.0f}", f"{pct(lat, 0.99) * 1000:.0f}",
                         f"{max(lat, default=float('nan')) * 1000:.0f}",
                         f"{max(held, default=0) / 1024:.0f}"])
            t += args.window
        lat = [x for _, x in acks]
        out = [render(f"{args.hosts} hosts, one {args.stacks}-sample profile each every "
                      f"{args.interval:g} s ({rate:g}/s), acknowledgements by window (ms)",
                      ["window s", "acked", "p50", "p99", "max", "collector RSS MB"], rows),
               render("Whole run", ["figure", "value"], [
                   ["requests sent", str(sent)],
                   ["acknowledged", str(len(acks))],
                   ["refused", ", ".join(f"{k}: {v}" for k, v in refused.items()) or "none"],
                   ["profiles acknowledged per second", f"{len(acks) / elapsed:.1f}"],
                   ["ack p50 / p99 / max (ms)",
                    f"{pct(lat, 0.5) * 1000:.0f} / {pct(lat, 0.99) * 1000:.0f} / "
                    f"{max(lat, default=float('nan')) * 1000:.0f}"],
                   ["collector CPU, with its workers (cores busy)", f"{cpu / elapsed:.2f}"],
                   ["of it, the collector's own process", f"{main_cpu / elapsed:.2f}"],
                   ["collector CPU a profile acknowledged (ms)",
                    f"{cpu / max(len(acks), 1) * 1e3:.1f}"],
                   ["this load's own CPU (cores busy)", f"{own / elapsed:.2f}"],
                   ["one profile read here, before / after (CPU ms: the machine's speed)",
                    f"{speed_before:.1f} / {speed_after:.1f}"],
                   ["collector peak RSS (MB)", f"{peak / 1024:.0f}"],
                   ["peak RSS with its workers (MB)", f"{peak_all / 1024:.0f}"],
                   ["... as PSS, each shared page once (MB)", f"{peak_pss / 1024:.0f}"],
                   ["blocks rolled up / rows grouped by series meanwhile",
                    f"{sealed} / {grouped:,}"]])]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
