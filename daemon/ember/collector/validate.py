"""Checks on everything a WriteRaw request carries. The collector stores
nothing it has not checked: label names, the pprof structure (as Parca's
server checks it) and sizes, with decompression bounded so a gzip bomb is
rejected rather than inflated."""

from __future__ import annotations

import gzip
import hashlib
import re
import zlib
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from ..encode.writeraw import LABEL_NAME, PROFILE_ID_PREFIX
from ..proto import profile_pb2 as pb
from ..proto import profilestore_pb2 as ps
from .store import StoredProfile

METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
MAX_LABELS = 64
MAX_LABEL_VALUE = 2048
MAX_SERIES = 20_000


class InvalidRequest(ValueError):
    """The request is malformed; the message says where and why."""


@dataclass(frozen=True)
class Limits:
    max_profile_size: int = 64 << 20


def decompress(raw: bytes, limit: int) -> bytes:
    if raw[:2] != b"\x1f\x8b":
        if len(raw) > limit:
            raise InvalidRequest(f"profile of {len(raw)} bytes is over the {limit} byte limit")
        return raw
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise InvalidRequest(f"bad gzip data: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise InvalidRequest(f"profile decompresses to more than {limit} bytes")
    if not d.eof:
        raise InvalidRequest("truncated gzip data")
    return out


def check_labels(labels: ps.LabelSet) -> tuple[tuple[str, str], ...]:
    seen: dict[str, str] = {}
    if len(labels.labels) > MAX_LABELS:
        raise InvalidRequest(f"{len(labels.labels)} labels, at most {MAX_LABELS}")
    for lb in labels.labels:
        if not LABEL_NAME.match(lb.name):
            raise InvalidRequest(f"invalid label name {lb.name[:64]!r}")
        if lb.name in seen:
            raise InvalidRequest(f"duplicate label {lb.name!r}")
        if len(lb.value) > MAX_LABEL_VALUE:
            raise InvalidRequest(f"label {lb.name} value longer than {MAX_LABEL_VALUE}")
        seen[lb.name] = lb.value
    name = seen.get("__name__")
    if not name:
        raise InvalidRequest("series has no __name__ label")
    if not METRIC_NAME.match(name):
        raise InvalidRequest(f"__name__ {name[:64]!r} is not a valid metric name")
    return tuple(sorted(seen.items()))


def check_profile(p: pb.Profile, n_exec_info: int) -> None:
    n_str = len(p.string_table)
    if n_str == 0 or p.string_table[0] != "":
        raise InvalidRequest("string table must start with the empty string")

    def s(i: int, what: str) -> None:
        if not 0 <= i < n_str:
            raise InvalidRequest(f"{what}: string index {i} out of range")

    if not p.sample_type:
        raise InvalidRequest("no sample types")
    for vt in [*p.sample_type, p.period_type]:
        s(vt.type, "value type")
        s(vt.unit, "value type unit")
    for i in (*p.comment, p.drop_frames, p.keep_frames, p.default_sample_type, p.doc_url):
        s(i, "profile string")
    for kind, ids in (("mapping", [m.id for m in p.mapping]),
                      ("location", [loc.id for loc in p.location]),
                      ("function", [f.id for f in p.function])):
        for pos, id_ in enumerate(ids):
            if id_ != pos + 1:
                raise InvalidRequest(f"{kind} {pos} has id {id_}, expected {pos + 1}")
    for m in p.mapping:
        s(m.filename, "mapping filename")
        s(m.build_id, "mapping build id")
    for f in p.function:
        for i in (f.name, f.system_name, f.filename):
            s(i, "function name")
    n_map, n_loc, n_fn = len(p.mapping), len(p.location), len(p.function)
    for loc in p.location:
        if loc.mapping_id > n_map:
            raise InvalidRequest(f"location {loc.id}: mapping id {loc.mapping_id} out of range")
        for line in loc.line:
            if not 0 < line.function_id <= n_fn:
                raise InvalidRequest(
                    f"location {loc.id}: function id {line.function_id} out of range")
    n_types = len(p.sample_type)
    for i, sample in enumerate(p.sample):
        if len(sample.value) != n_types:
            raise InvalidRequest(f"sample {i} has {len(sample.value)} values for "
                                 f"{n_types} sample types")
        for lid in sample.location_id:
            if not 0 < lid <= n_loc:
                raise InvalidRequest(f"sample {i}: location id {lid} out of range")
        for lb in sample.label:
            if lb.key == 0:
                raise InvalidRequest(f"sample {i}: label key 0")
            s(lb.key, "label key")
            s(lb.str, "label value")
            s(lb.num_unit, "label unit")
    if n_exec_info and n_exec_info != n_map:
        raise InvalidRequest(f"{n_exec_info} executable_info entries for {n_map} mappings")


def profile_type(name: str, p: pb.Profile) -> str:
    """Parca's profile type notation, name:type:unit:period_type:period_unit."""
    st = p.string_table
    main = p.sample_type[-1]
    return ":".join([name, st[main.type], st[main.unit], st[p.period_type.type],
                     st[p.period_type.unit]])


def profile_id(data: bytes, p: pb.Profile) -> str:
    for i in p.comment:
        c = p.string_table[i]
        if c.startswith(PROFILE_ID_PREFIX):
            pid = c[len(PROFILE_ID_PREFIX):]
            if 0 < len(pid) <= 128 and pid.isalnum():
                return pid
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_request(req: ps.WriteRawRequest, limits: Limits,
                  now_ns: int) -> list[StoredProfile]:
    """Everything to store for a valid request; InvalidRequest otherwise."""
    if len(req.series) > MAX_SERIES:
        raise InvalidRequest(f"{len(req.series)} series, at most {MAX_SERIES}")
    out: list[StoredProfile] = []
    for si, series in enumerate(req.series):
        try:
            labels = check_labels(series.labels)
        except InvalidRequest as exc:
            raise InvalidRequest(f"series {si}: {exc}") from None
        name = dict(labels)["__name__"]
        for pi, sample in enumerate(series.samples):
            where = f"series {si} sample {pi}"
            if not sample.raw_profile:
                raise InvalidRequest(f"{where}: empty raw_profile")
            try:
                data = decompress(sample.raw_profile, limits.max_profile_size)
                p = pb.Profile.FromString(data)
                check_profile(p, len(sample.executable_info))
            except InvalidRequest as exc:
                raise InvalidRequest(f"{where}: {exc}") from None
            except DecodeError as exc:
                raise InvalidRequest(f"{where}: not a pprof profile: {exc}") from None
            gz = (sample.raw_profile if sample.raw_profile[:2] == b"\x1f\x8b"
                  else gzip.compress(data, mtime=0))
            out.append(StoredProfile(
                profile_id=profile_id(data, p), series_labels=labels,
                type=profile_type(name, p), time_ns=p.time_nanos or now_ns,
                duration_ns=max(0, p.duration_nanos),
                samples=sum(x.value[0] for x in p.sample if x.value), data=gz))
    return out
