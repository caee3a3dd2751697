"""The converter table: one entry per kind of option, each converting good
values, rejecting bad ones with the message the file's author sees, and
rendering defaults as one would write them."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ember.config.kinds import KINDS, convert, render
from ember.config.options import Key, Option, keys_of
from ember.config.schema import Config, Rule


def all_keys(cls: type[Any] = Config) -> list[Key]:
    out = []
    for key in keys_of(cls):
        out.extend(all_keys(key.section) if key.section is not None else [key])
    return out


def test_every_kind_in_the_schema_has_a_converter() -> None:
    used = {key.option.kind for key in all_keys()}
    assert used <= set(KINDS)
    assert set(KINDS) <= used, "a kind nothing uses"


@pytest.mark.parametrize(("kind", "value", "expected"), [
    ("bool", True, True),
    ("int", 7, 7),
    ("duration", "250ms", 0.25),
    ("duration", 3, 3.0),
    ("size", "2KiB", 2048),
    ("hostport", ":7070", "0.0.0.0:7070"),
    ("path", "/x", "/x"),
    ("str", "node-1", "node-1"),
    ("int_list", [3, 1], (3, 1)),
    ("str_list", ["a"], ("a",)),
    ("regex_list", ["^a$"], ("^a$",)),
    ("type_list", ["b", "a", "b"], ("b", "a")),
    ("type_list", True, ("a", "b")),
    ("type_list", False, ()),
    ("labels", {"z": 1, "a": "x"}, (("a", "x"), ("z", "1"))),
    ("relabel", [{"action": "labeldrop", "regex": "tmp_.*"}],
     (Rule(action="labeldrop", regex="tmp_.*"),)),
])
def test_converts(kind: str, value: Any, expected: Any) -> None:
    assert convert(Option("", kind, choices=("a", "b")), value) == expected


@pytest.mark.parametrize(("kind", "value", "message"), [
    ("bool", 1, "expected true or false, got 1"),
    ("int", True, "expected an integer, got True"),
    ("int", "9", "expected an integer, got '9'"),
    ("duration", "soon", "not a duration: 'soon'"),
    ("size", "lots", "not a size: 'lots'"),
    ("hostport", 80, "expected HOST:PORT, got 80"),
    ("hostport", "nowhere", "not HOST:PORT: 'nowhere'"),
    ("path", 1, "expected a path, got 1"),
    ("str", [], "expected a string, got []"),
    ("int_list", "1", "expected a list, got '1'"),
    ("int_list", [1, 0], "expected positive integers, got 0"),
    ("str_list", ["a", 2], "expected strings, got 2"),
    ("regex_list", ["("], "bad regular expression '('"),
    ("type_list", "a", "expected true, false or a list of profile types"),
    ("type_list", ["a", "c"], "unknown profile type 'c' (one of a, b)"),
    ("labels", [], "expected a mapping of label names to values"),
    ("labels", {"__x": "y"}, "not a valid label name: '__x'"),
    ("labels", {"x": True}, "label x needs a string value, got True"),
    ("relabel", {}, "expected a list of relabel rules"),
    ("relabel", [3], "rule 1: expected a mapping, got 3"),
    ("relabel", [{"action": "labeldrop"}, {"bogus": 1}], "rule 2: unknown key 'bogus'"),
    ("relabel", [{"source_labels": "a"}], "rule 1: source_labels must be a list of names"),
    ("relabel", [{"regex": 1}], "rule 1: regex must be a string"),
    ("relabel", [{"action": "nope"}], "rule 1: unknown relabel action 'nope'"),
    ("relabel", [{"action": "keep"}], "rule 1: action keep needs source_labels"),
])
def test_rejects(kind: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        convert(Option("", kind, lo=1, choices=("a", "b")), value)


@pytest.mark.parametrize(("kind", "value", "ok"), [
    ("int", 1, True), ("int", 10, True), ("int", 0, False), ("int", 11, False),
    ("duration", "1s", True), ("duration", "10s", True), ("duration", "999ms", False),
    ("duration", "11s", False), ("size", 10, True), ("size", "1KiB", False),
])
def test_ranged_kinds_check_the_range(kind: str, value: Any, ok: bool) -> None:
    option = Option("", kind, lo=1, hi=10)
    if ok:
        convert(option, value)
    else:
        with pytest.raises(ValueError, match=rf"^{value!r} is out of range \[1, 10\]$"):
            convert(option, value)


def test_only_numbers_are_ranged() -> None:
    assert {name for name, kind in KINDS.items() if kind.ranged} == {"int", "duration", "size"}


@pytest.mark.parametrize(("kind", "value", "text"), [
    ("bool", False, "false"), ("int", 19, "19"), ("duration", 0.000001, "1us"),
    ("duration", 0.001, "1ms"), ("duration", 0.0, "0s"), ("duration", 604800.0, "604800s"),
    ("size", 256 << 20, "256MiB"), ("size", 4097, "4097"), ("hostport", "h:1", "h:1"),
    ("path", "", '""'), ("str_list", (), "[]"), ("str_list", ("/a",), "['/a']"),
    ("labels", (), "[]"), ("relabel", (), "[]"), ("type_list", ("a", "b"), "true"),
    ("type_list", ("b",), "[b]"),
])
def test_renders_defaults(kind: str, value: Any, text: str) -> None:
    assert render(Option("", kind, choices=("a", "b")), value) == text
