"""The collector's HTTP query API: what the web UI, ``ember query`` and
``ember flamegraph URL`` ask of the stored profiles.

Every route reads a time range (``since=1h`` or ``from=NS&to=NS``) and label
matchers (``match=LABEL=VALUE``, repeatable) and answers JSON errors as
{"error": ...}: 400 for bad parameters, 404 when nothing matches.

  GET /api/v1/profile?type=cpu|offcpu|...|TYPE&format=folded|pprof|json
  GET /api/v1/flamegraph?type=...|hotcold&title=&width=      SVG
  GET /api/v1/diff?type=&a_since=&a_match=...&b_...&normalize=1   SVG
  GET /api/v1/top?type=&limit=50          self/total per function (JSON)
  GET /api/v1/timeline?type=&buckets=60   samples per time bucket (JSON)
  GET /api/v1/labels                      label names
  GET /api/v1/labels/NAME/values          values of one label
  GET /api/v1/types                       stored profile types, kind aliases

Kept apart from server.py (the collector's lifecycle, gRPC and auth) so the
routes can be read, and called, without any server running.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from ..config import parse_duration
from ..flamegraph.graphs import diff_graph, graph, hotcold_graph, top_functions
from ..flamegraph.inputs import Stacks, stacks_of
from ..httpserve import Reply
from ..model import CPU, OFFCPU
from .query import FORMATS, TYPE_ALIASES, Merged, merge, render
from .store import Store

Query = dict[str, list[str]]
Route = Callable[[Query], Reply]

#: A flame graph type that is no profile kind: on-CPU and off-CPU time in one.
HOTCOLD = "hotcold"
_LABEL_VALUES = ("/api/v1/labels/", "/values")  # /api/v1/labels/NAME/values


def error(code: int, msg: str) -> Reply:
    return code, json.dumps({"error": msg}).encode(), "application/json"


def _ok(obj: Any) -> Reply:
    return 200, json.dumps(obj).encode(), "application/json"


def _svg(text: str) -> Reply:
    return 200, text.encode(), "image/svg+xml"


def _param(q: Query, name: str, default: str) -> str:
    """The last value given for a parameter."""
    return q.get(name, [default])[-1]


def _type(q: Query) -> str:
    return _param(q, "type", CPU.name)


def _select(q: Query, prefix: str = "") -> tuple[int, int, dict[str, str]]:
    """(start_ns, end_ns, matchers) from since / from+to and match params
    (prefix "a_" / "b_" for the two sides of a diff)."""
    def get(name: str, default: str | None = None) -> str | None:
        v = q.get(prefix + name) or ([default] if default is not None else None)
        return v[-1] if v else None

    now = time.time_ns()
    if get("from") is not None or get("to") is not None:
        try:
            start = int(get("from", "0") or 0)
            end = int(get("to", str(now)) or now)
        except ValueError:
            raise ValueError("from and to are Unix times in nanoseconds") from None
    else:
        start = now - int(parse_duration(get("since", "1h") or "1h") * 1e9)
        end = now
    if end <= start:
        raise ValueError("the time range is empty")
    return start, end, _matchers(q.get(prefix + "match", []))


def _matchers(params: list[str]) -> dict[str, str]:
    matchers = {}
    for m in params:
        if not m:
            continue
        name, sep, value = m.partition("=")
        if not sep or not name:
            raise ValueError(f"match must be LABEL=VALUE, not {m!r}")
        matchers[name] = value
    return matchers


def _width(q: Query) -> int:
    try:
        return max(300, min(8000, int(_param(q, "width", "1200"))))
    except ValueError:
        raise ValueError("width must be a number of pixels") from None


class Api:
    """The query routes over one store, in one table. Authentication, health
    and metrics stay with the Collector, which hands the rest here."""

    def __init__(self, store: Store):
        self.store = store
        self.routes: dict[str, Route] = {
            "/api/v1/profile": self._profile, "/api/v1/flamegraph": self._flamegraph,
            "/api/v1/diff": self._diff, "/api/v1/top": self._top,
            "/api/v1/timeline": self._timeline, "/api/v1/labels": self._labels,
            "/api/v1/types": self._types}

    def handle(self, path: str, q: Query) -> Reply:
        route = self._route(path)
        if route is None:
            return error(404, f"no such endpoint: {path}")
        try:
            return route(q)
        except ValueError as exc:
            return error(400, str(exc))
        except LookupError as exc:
            return error(404, str(exc))

    def _route(self, path: str) -> Route | None:
        """The table's route, or the one route with a name in its path."""
        if path in self.routes:
            return self.routes[path]
        head, tail = _LABEL_VALUES
        if path.startswith(head) and path.endswith(tail):
            name = unquote(path[len(head):-len(tail)])
            return lambda q: self._label_values(name)
        return None

    # --- parameters -> profiles ---
    def _merged(self, q: Query, type_: str, prefix: str = "") -> Merged:
        start, end, matchers = _select(q, prefix)
        merged = merge(self.store.query(start, end, matchers, TYPE_ALIASES.get(type_, type_)),
                       start, end)
        if merged is None:
            raise LookupError("no profiles match")
        return merged

    def _stacks(self, q: Query, type_: str, prefix: str = "") -> Stacks:
        p = self._merged(q, type_, prefix).profile
        return stacks_of(p.type, p.samples)

    # --- routes ---
    def _labels(self, q: Query) -> Reply:
        return _ok({"labels": self.store.label_names()})

    def _label_values(self, name: str) -> Reply:
        return _ok({"label": name, "values": self.store.label_values(name)})

    def _types(self, q: Query) -> Reply:
        return _ok({"types": self.store.types(), "aliases": TYPE_ALIASES})

    def _profile(self, q: Query) -> Reply:
        fmt = _param(q, "format", "folded")
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}")
        body, ctype = render(self._merged(q, _type(q)), fmt)
        return 200, body, ctype

    def _flamegraph(self, q: Query) -> Reply:
        type_ = _type(q)
        title = _param(q, "title", "") or None
        width = _width(q)
        if type_ == HOTCOLD:
            return _svg(hotcold_graph(self._stacks(q, CPU.name), self._stacks(q, OFFCPU.name),
                                      title, width=width))
        return _svg(graph(self._stacks(q, type_), title, width=width))

    def _diff(self, q: Query) -> Reply:
        type_ = _type(q)
        sides: list[Stacks | None] = []
        for prefix in ("a_", "b_"):
            try:
                sides.append(self._stacks(q, type_, prefix))
            except LookupError:
                sides.append(None)  # no data on one side: everything on the other is new
        if sides[0] is None and sides[1] is None:
            raise LookupError("no profiles match either side")
        some = next(s for s in sides if s is not None)
        before, after = (s if s is not None else Stacks(Counter(), some.unit, {}) for s in sides)
        normalize = _param(q, "normalize", "1") not in ("0", "false", "")
        text, _ = diff_graph(before, after, normalize=normalize, strip=True,
                             title=_param(q, "title", "") or None, width=_width(q))
        return _svg(text)

    def _top(self, q: Query) -> Reply:
        s = self._stacks(q, _type(q))
        rows = top_functions(s, limit=int(_param(q, "limit", "50")))
        return _ok({"unit": s.unit, "total": s.total, "rows": rows})

    def _timeline(self, q: Query) -> Reply:
        start, end, matchers = _select(q)
        type_ = _type(q)
        n = max(1, min(500, int(_param(q, "buckets", "60"))))
        width = (end - start) / n
        buckets = [0] * n
        for row in self.store.query(start, end, matchers, TYPE_ALIASES.get(type_, type_)):
            i = int((row.time_ns - start) / width)
            buckets[min(n - 1, max(0, i))] += row.samples
        return _ok({"start": start, "end": end, "bucket_ns": width, "values": buckets})
