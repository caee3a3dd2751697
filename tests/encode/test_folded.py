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


def test_read_folded_across_chunks_and_bad_bytes() -> None:
    from ember.encode.folded import read_folded

    data = "a;\u00e9t\u00e9 2\n\na;b 3\r\na;b 1".encode() + b"\nx;\xff\xfe 4\n"
    whole = read_folded([data])
    assert whole == {"a;\u00e9t\u00e9": 2, "a;b": 4, "x;\ufffd\ufffd": 4}
    # one byte at a time: lines and UTF-8 sequences split anywhere
    assert read_folded([data[i:i + 1] for i in range(len(data))]) == whole


def test_read_folded_names_the_bad_line() -> None:
    from ember.encode.folded import FoldedError, read_folded

    lines = [b"a;b 1\n"] * 5 + [b"a;b \xb2\n"]  # '\xb2' is no digit, whatever isdigit says
    with pytest.raises(FoldedError) as err:
        read_folded([b"".join(lines)])
    assert err.value.lineno == 6
    with pytest.raises(FoldedError, match=r"line 2: count 1{19}\.\.\. out of range"):
        read_folded([b"a 1\na " + b"1" * 5000 + b"\n"])
    with pytest.raises(FoldedError, match="line 1: expected 'stack count'"):
        read_folded(["a ²\n".encode()])  # a digit to str.isdigit, not to int()
