"""Golden tests for folded output: tests/golden/*.folded hold the expected bytes."""

from __future__ import annotations

import pytest

from ember.encode.folded import encode_folded, parse_folded
from tests.support import GOLDEN
from tests.support.profiles import cpu_profile, offcpu_profile


@pytest.mark.parametrize(("name", "profile", "delimiter"), [
    ("cpu", cpu_profile(), False),
    ("cpu_delimited", cpu_profile(), True),
    ("offcpu", offcpu_profile(), True),
])
def test_golden(name: str, profile: object, delimiter: bool) -> None:
    text = encode_folded(profile, delimiter=delimiter)  # type: ignore[arg-type]
    assert text == (GOLDEN / f"{name}.folded").read_text()


def test_threads_merge_and_units() -> None:
    folded = parse_folded(encode_folded(cpu_profile()))
    assert folded["app;main;ns::Box<int>::operator()(int) const"] == 10
    off = parse_folded(encode_folded(offcpu_profile()))
    assert off["kworker/0:1;schedule;[runnable]"] == 2  # 2500 ns -> 2 us


def test_separators_in_names_are_replaced() -> None:
    from ember.encode.folded import clean
    assert clean("a;b\nc") == "a:b c"


def test_parse_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="line 2"):
        parse_folded("a;b 1\nno-count-here\n")
