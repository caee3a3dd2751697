"""The collector's HTTP query API: what the web UI, ``ember query`` and
``ember flamegraph URL`` ask of the stored profiles.

Every route reads a time range (``since=1h`` or ``from=NS&to=NS``) and label
matchers (``match=LABEL=VALUE``, also ``!=``, ``=~`` and ``!~``, repeatable:
matchers.py) and answers JSON errors as {"error": ...}: 400 for bad
parameters, 404 when nothing matches.

  GET /api/v1/profile?type=cpu|offcpu|...|TYPE&format=folded|pprof|json
  GET /api/v1/tree?type=&focus=THREAD;F1;F2&search=RE&max_nodes=5000
                     the pruned tree under a frame (zoom) and the share
                     a search matches over the whole profile (JSON)
  GET /api/v1/flamegraph?type=...|hotcold&title=&width=      SVG
  GET /api/v1/diff?type=&a_since=&a_match=...&b_...&normalize=1   SVG
  GET /api/v1/top?type=&limit=50          self/total per function (JSON)
  GET /api/v1/sandwich?type=&name=FUNCTION&max_nodes=5000
                     one function's callers (inverted) and callees (JSON)
  GET /api/v1/timeline?type=&buckets=60   samples per time bucket (JSON)
  GET /api/v1/labels                      label names
  GET /api/v1/labels/NAME/values          values of one label
  GET /api/v1/types                       stored profile types, kind aliases

Kept apart from server.py (the collector's lifecycle, gRPC and auth) so the
routes can be read, and called, without any server running.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import numpy as np

from ..config import parse_duration
from ..flamegraph.graphs import diff_graph, graph, hotcold_graph
from ..flamegraph.inputs import Stacks
from ..httpserve import Reply, holding
from ..model import CPU, OFFCPU
from . import arena
from .cache import Cache
from .engine import DEFAULT_NODES, MAX_NODES, Tree, kinds_of
from .index import Index
from .matchers import Selector, selector
from .query import FORMATS, SHAPE, TYPE_ALIASES, profile_of, render, scaled
from .store import Aggregate, Store
from .validate import INT64_MAX
from .window import Made, Windows

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


#: The longest ``since``: retention is counted in days, never years.
MAX_SINCE_DAYS = 400
MAX_LIMIT = 10_000  # rows of /top
MAX_BUCKETS = 500  # bars of /timeline
MAX_WIDTH = 100_000  # pixels asked of a flame graph (drawn at 300..8000)
#: Routes whose answers are kept (``Api.rendered``): the JSON views a page
#: and everyone looking at the same range ask for again and again.
RENDERED = frozenset({"/api/v1/tree", "/api/v1/top", "/api/v1/sandwich", "/api/v1/timeline"})


def _int(q: Query, name: str, default: int, low: int, high: int, what: str) -> int:
    """An integer parameter in [low, high]; ValueError naming it otherwise."""
    text = _param(q, name, str(default))
    try:
        value = int(text)
    except ValueError:  # also digits past Python's int() limit
        value = None
    if value is None or not low <= value <= high:
        raise ValueError(f"{name} must be {what} from {low} to {high}, not {text[:40]!r}")
    return value


def _select(q: Query, prefix: str = "") -> tuple[int, int, Selector]:
    """(start_ns, end_ns, matchers) from since / from+to and match params
    (prefix "a_" / "b_" for the two sides of a diff)."""
    now = time.time_ns()
    if prefix + "from" in q or prefix + "to" in q:
        unix_ns = "a Unix time in nanoseconds"
        start = _int(q, prefix + "from", 0, 0, INT64_MAX, unix_ns)
        end = _int(q, prefix + "to", now, 0, INT64_MAX, unix_ns)
    else:
        name = prefix + "since"
        text = _param(q, name, "1h")
        try:
            seconds = parse_duration(text)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds <= MAX_SINCE_DAYS * 86400:
            raise ValueError(f"{name} must be a duration up to {MAX_SINCE_DAYS}d "
                             f"(e.g. 15m, 1h, 7d), not {text[:40]!r}")
        # to a step of 1/360 of the range (at least a second; 10 s for an
        # hour, one agent interval): the requests of a page, and of people
        # looking at the same range, share one merge until the next write
        step = max(10**9, int(seconds * 1e9) // 360 // 10**9 * 10**9)
        now = -(-now // step) * step   # up: the newest profiles stay in
        start, end = now - int(seconds * 1e9), now
    if end <= start:
        raise ValueError("the time range is empty")
    return start, end, selector(q.get(prefix + "match", []))


def _width(q: Query) -> int:
    """The flame graph's width, clamped to 300..8000: the page asks for its
    frame's width, whatever the window."""
    return max(300, min(8000, _int(q, "width", 1200, 0, MAX_WIDTH, "a number of pixels")))


class Api:
    """The query routes over one store, in one table. Authentication, health
    and metrics stay with the Collector, which hands the rest here."""

    def __init__(self, store: Store, on_skip: Callable[[str, int], None] | None = None):
        self.store = store
        self.on_skip = on_skip  # hears of stored profiles a merge left out
        self.index = Index(store)
        # what is kept is bounded by bytes as well: a tree of a fleet's hour
        # is 6.4 MB, its sums 22 MB; with the windows' (which hold trees of
        # their own) and the kept arrays', 64 MB each took the collector's
        # peak RSS past 500 MB in some runs of bench/store_engine.py
        self.cache: Cache[Tree] = Cache("collector_trees", 8, 32 << 20, lambda t: t.nbytes)
        # The sums of a range's one sample type, for the trees that read it
        # (off-CPU's flame graph and table read the same one), asked for at
        # once as a page opens: one merge. Only the type a tree shows is
        # summed: each costs as much again over a fleet's hour.
        self.sums: Cache[Aggregate] = Cache("collector_sums", 2, 48 << 20, lambda a: a.nbytes)
        self.rendered: Cache[Reply] = Cache("collector_answers", 16, 16 << 20,
                                            lambda r: len(r[1]))
        self.windows = Windows()
        self._making = threading.Lock()   # one view's answer made at a time
        self.routes: dict[str, Route] = {
            "/api/v1/profile": self._profile, "/api/v1/tree": self._tree_route,
            "/api/v1/flamegraph": self._flamegraph,
            "/api/v1/diff": self._diff, "/api/v1/top": self._top,
            "/api/v1/sandwich": self._sandwich,
            "/api/v1/timeline": self._timeline, "/api/v1/labels": self._labels,
            "/api/v1/types": self._types}

    def handle(self, path: str, q: Query) -> Reply:
        arena.use()   # (large arrays kept for the next request: arena.py)
        route = self._route(path)
        if route is None:
            return error(404, f"no such endpoint: {path}")
        try:
            if path in RENDERED:
                return self._rendered(path, route, q)
            return route(q)
        except ValueError as exc:
            return error(400, str(exc))
        except LookupError as exc:
            return error(404, str(exc))

    def _rendered(self, path: str, route: Route, q: Query) -> Reply:
        """The route's answer, made once per (question, range, store
        generation): the range resolved first, so a "since" and the answer
        kept for it name the same seconds. A tree is cached, but drawing
        5,000 of its nodes as JSON or its table costs tens of milliseconds
        of Python each time, and viewers of one range ask alike."""
        start, end, matchers = _select(q)
        asked = {k: v for k, v in q.items() if k not in ("since", "from", "to")}
        key = (path, start, end, tuple(sorted((k, tuple(v)) for k, v in asked.items())))
        reply = self.rendered.get(self._generation_of(matchers), key,
                                  lambda: self._one_at_a_time(route, {**asked,
                                                              "from": [str(start)],
                                                              "to": [str(end)]}))
        if reply is None:   # a route answers or raises
            raise LookupError(f"{path}: no answer")
        return reply

    def _one_at_a_time(self, route: Route, q: Query) -> Reply:
        """A view's answer made while no other is: each makes arrays the
        size of the index (800,000 nodes for a fleet hour: 30-40 MB for a
        moment), and after a write every open view is made again at once;
        on two cores, made together they finish no sooner. A request whose
        client left stops waiting."""
        with holding(self._making):
            return route(q)

    def _generation_of(self, matchers: Selector) -> int:
        """The generation an answer about these series is of (caches key on it)."""
        return self.store.generation_of(self.store.series_matching(matchers))

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
    def _aggregate(self, q: Query, type_: str, prefix: str = "") -> tuple[Aggregate, int, int]:
        start, end, matchers = _select(q, prefix)
        agg = self.store.aggregate(start, end, matchers, TYPE_ALIASES.get(type_, type_))
        if agg is None:
            raise LookupError("no profiles match")
        if self.on_skip is not None and agg.skipped:
            self.on_skip(SHAPE, agg.skipped.get(SHAPE, 0))
        return agg, start, end

    def _tree(self, q: Query, type_: str, prefix: str = "", folded: bool = False) -> Tree:
        """The merged tree of a query, shared by the views that ask for it
        until the next write. Its value is the main (last) one, as the flame
        graphs draw it, or with ``folded`` the one folded output shows (on-CPU:
        samples; other time: microseconds)."""
        start, end, matchers = _select(q, prefix)
        stored = TYPE_ALIASES.get(type_, type_)
        key = (stored, start, end, matchers.key(), folded)

        def build(generation: int) -> Made | None:
            shapes = self.store.shapes(stored)
            if not shapes:
                return None
            types = shapes[0].sample_types
            last_type, last_unit = types[-1]
            if folded:
                t = scaled(shapes[0])
                unit = "microseconds" if t.folded_scale == 1000 else types[0][1]
                index, scale = t.folded_index, t.folded_scale
            else:
                unit = "ns" if last_unit == "nanoseconds" else last_type
                index, scale = len(types) - 1, 1
            agg = self.sums.get(generation, (stored, start, end, matchers.key(), index),
                                lambda: self.store.aggregate(start, end, matchers, stored,
                                                             by_name=True, value=index,
                                                             upto=generation, raw=True))
            if agg is None:
                return None
            if self.on_skip is not None and agg.skipped:
                self.on_skip(SHAPE, agg.skipped.get(SHAPE, 0))
            tree = Tree.build(self.index, agg, index, unit, offcpu=last_type == "off_cpu",
                              scale=scale, sample_types=types)
            return Made(start, end, generation, agg.shape, index, tree)

        def make() -> Tree | None:
            return self.windows.tree(self.store, (stored, matchers.key(), folded), stored,
                                     matchers, start, end, build)

        tree = self.cache.get(self._generation_of(matchers), key, make)
        if tree is None:
            raise LookupError("no profiles match")
        return tree

    def _stacks(self, q: Query, type_: str, prefix: str = "") -> Stacks:
        """Folded stacks of the pruned tree (every total exact) for the SVG
        views: what is too narrow to draw stays in its parent."""
        t = self._tree(q, type_, prefix)
        return Stacks(Counter(dict(t.folded())), t.unit, kinds_of(self.index), offcpu=t.offcpu)

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
        type_ = _type(q)
        if fmt == "json":
            return self._tree_route(q)
        agg, start, end = self._aggregate(q, type_)
        body, ctype = render(profile_of(self.store, agg, start, end), fmt)
        return 200, body, ctype

    def _tree_route(self, q: Query) -> Reply:
        t = self._tree(q, _type(q), folded=True)
        focus_text = _param(q, "focus", "")
        focus = t.find(focus_text.split(";")) if focus_text else 0
        max_nodes = _int(q, "max_nodes", DEFAULT_NODES, 1, MAX_NODES, "a number of nodes")
        head: dict[str, Any] = {"unit": t.unit, "sample_types": [list(x) for x in t.sample_types],
                                "profiles": t.profiles, "total": int(t.total[0]) // t.scale,
                                "focus": t.path(focus)}
        search = _param(q, "search", "")
        if search:
            value, share = t.matched(search, focus)
            head["matched"] = {"search": search, "value": value // t.scale, "share": share}
        text = json.dumps(head)
        body = f'{text[:-1]}, "tree": {t.nested_json(focus, max_nodes)}}}'
        return 200, body.encode(), "application/json"

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
        t = self._tree(q, _type(q))
        sort = _param(q, "sort", "self")
        if sort not in ("self", "total"):
            raise ValueError("sort must be self or total")
        rows = t.top(_int(q, "limit", 50, 1, MAX_LIMIT, "a number of rows"), sort)
        return _ok({"unit": t.unit, "total": int(t.total[0]), "rows": rows})

    def _sandwich(self, q: Query) -> Reply:
        name = _param(q, "name", "")
        if not name:
            raise ValueError("name (a function name) is required")
        max_nodes = _int(q, "max_nodes", DEFAULT_NODES, 1, MAX_NODES, "a number of nodes")
        return _ok(self._tree(q, _type(q)).sandwich(name, max_nodes))

    def _timeline(self, q: Query) -> Reply:
        start, end, matchers = _select(q)
        type_ = _type(q)
        n = _int(q, "buckets", 60, 1, MAX_BUCKETS, "a number of buckets")
        by = _param(q, "by", "")
        width = (end - start) / n
        times, sids, samples = self.store.timeline(start, end, matchers,
                                                   TYPE_ALIASES.get(type_, type_))
        # each profile's bucket, and the key of its series (its ``by`` label)
        bucket = np.clip(((times - start) / width).astype(np.int64), 0, n - 1)
        nums, of_series = np.unique(sids, return_inverse=True)
        names = [self.store.series_labels(int(s)).get(by, "") if by else "" for s in nums]
        keys = sorted(set(names))
        row = np.searchsorted(np.array(keys, dtype=object), np.array(names, dtype=object)) \
            if keys else np.zeros(0, np.int64)
        grid = np.zeros((len(keys), n), np.int64)
        if len(samples) and float(samples.astype(np.float64).sum()) < 2.0**62:
            np.add.at(grid, (row[of_series.reshape(-1)], bucket), samples)
            values = grid.tolist()
        else:   # sums past int64: Python's integers
            exact = [[0] * n for _ in keys]
            for r, b, v in zip(row[of_series.reshape(-1)].tolist(), bucket.tolist(),
                               samples.tolist(), strict=True):
                exact[r][b] += v
            values = exact
        series = dict(zip(keys, values, strict=True))
        reply: dict[str, Any] = {"start": start, "end": end, "bucket_ns": width,
                                 "values": [sum(col) for col in zip(*series.values(),
                                                                    strict=True)]
                                 if series else [0] * n}
        if by:
            reply["by"] = by
            reply["series"] = [{"value": k, "values": v} for k, v in series.items()]
        return _ok(reply)
