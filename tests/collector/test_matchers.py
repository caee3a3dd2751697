"""Label matchers: the four operators, anchoring, several values of one
label, and what the store selects with them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ember.collector.matchers import Matcher, Selector, parse, selector
from ember.collector.server import Collector
from ember.collector.validate import check_request
from ember.config import CollectorConfig
from ember.proto import profilestore_pb2 as ps
from tests.support.collector import series

LABELS = [{"host": "a", "comm": "web"}, {"host": "b", "comm": "web-2"},
          {"host": "c", "comm": "db"}, {"comm": "cron"}]


def chosen(*texts: str) -> list[int]:
    sel = selector(texts)
    return [i for i, labels in enumerate(LABELS) if sel.holds(labels)]


@pytest.mark.parametrize("texts, expected", [
    ((), [0, 1, 2, 3]),
    (("host=a",), [0]),
    (("host!=a",), [1, 2, 3]),
    (("comm=~web",), [0]),                 # anchored: not "web-2"
    (("comm=~web.*",), [0, 1]),
    (("comm!~web.*",), [2, 3]),
    (("host=a", "host=c"), [0, 2]),        # several values of one label: any
    (("host=a", "comm=db"), []),           # different labels: all
    (("host!=a", "host!=b"), [2, 3]),      # negations: all
    (("host=",), [3]),                     # absent is empty
    (("host!=",), [0, 1, 2]),
    (("comm=~w.*", "host!=b"), [0]),
    (("host=~a|b", "comm!=web"), [1]),
])
def test_operators(texts: tuple[str, ...], expected: list[int]) -> None:
    assert chosen(*texts) == expected


def test_parsing_takes_the_longest_operator_and_keeps_the_value_whole() -> None:
    assert parse("a!=b") == Matcher("a", "!=", "b")
    assert parse("a=~b=c") == Matcher("a", "=~", "b=c")
    assert parse("a=!~b") == Matcher("a", "=", "!~b")
    assert parse("k=") == Matcher("k", "=", "")
    for bad in ("", "=x", "!=x", "novalue", "~a=b"):
        with pytest.raises(ValueError, match="match must be LABEL=VALUE"):
            parse(bad)


def test_order_does_not_change_the_cache_key() -> None:
    assert selector(["b=1", "a=~x"]).key() == selector(["a=~x", "b=1"]).key()
    assert selector({"a": "1"}) == selector(["a=1"])
    assert not Selector() and selector(["a=1"])


def test_the_store_reads_the_series_the_matchers_select(tmp_path: Path) -> None:
    c = Collector(CollectorConfig(storage=str(tmp_path / "db.sqlite")))
    try:
        req = ps.WriteRawRequest(series=[series(pid) for pid in (10, 11, 12)])
        c.store.write(check_request(req, c.limits, time.time_ns()))
        cpu = c.store.types()[0]
        end = time.time_ns() + 10**9

        def pids(*texts: str) -> set[str]:
            return {r.labels["pid"] for r in c.store.query(0, end, selector(texts), cpu)}

        assert pids() == {"10", "11", "12"}
        assert pids("pid!=11") == {"10", "12"}
        assert pids("pid=10", "pid=12") == {"10", "12"}
        assert pids("pid=~1[01]", "comm=app") == {"10", "11"}
        assert pids("pid!~1.") == set()
        one = c.store.aggregate(0, end, selector(["pid=11"]), cpu)
        every = c.store.aggregate(0, end, selector([]), cpu)
        assert one is not None and every is not None
        assert 3 * int(one.values[-1].sum()) == int(every.values[-1].sum())
    finally:
        c.close()
