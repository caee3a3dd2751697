"""The kinds of config values: for each, one small function that turns what
YAML gave into the typed value (or a ValueError saying what was expected),
whether the key's range bounds it, and how its default reads in the
reference. Adding a kind of option is one entry in ``KINDS``.

Values reach the program's C side (BPF maps, the kernel, SQLite) and
arithmetic (durations times 1e9), so every number is finite and fits: a
ranged value without an upper bound is bounded by ``INT64_MAX``, list items
(process IDs) by ``INT32_MAX``, whatever the reference shows."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from .options import Option
from .schema import Rule
from .units import parse_duration, parse_hostport, parse_size, render_duration, render_size

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RULE_STRINGS = ("separator", "regex", "target_label", "replacement", "action")
INT64_MAX = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1


def _render_scalar(value: Any, option: Option) -> str:
    return str(value) if value != "" else '""'


def _render_list(value: Any, option: Option) -> str:
    return "[]" if not value else repr(list(value))


@dataclass(frozen=True)
class Kind:
    convert: Callable[[Any, Option], Any]
    render: Callable[[Any, Option], str] = _render_scalar
    ranged: bool = False            # the option's lo/hi bound the converted value


def convert(option: Option, value: Any) -> Any:
    """A YAML value as the option's typed value; ValueError says what is wrong."""
    kind = KINDS[option.kind]
    out = kind.convert(value, option)
    if kind.ranged:
        hi = INT64_MAX if option.hi is None else option.hi
        if not math.isfinite(out):  # NaN compares false with any bound
            raise ValueError(f"{value!r} is not a finite number")
        if (option.lo is not None and out < option.lo) or out > hi:
            raise ValueError(f"{value!r} is out of range [{option.lo}, {hi}]")
    return out


def render(option: Option, value: Any) -> str:
    """A value as the reference shows it (as one would write it in the file)."""
    return KINDS[option.kind].render(value, option)


# --- scalars ------------------------------------------------------------------

def _bool(value: Any, option: Option) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _int(value: Any, option: Option) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _hostport(value: Any, option: Option) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return parse_hostport(value)


def _path(value: Any, option: Option) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a path, got {value!r}")
    return value


def _str(value: Any, option: Option) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _choice(value: Any, option: Option) -> str:
    if not isinstance(value, str) or value not in option.choices:
        raise ValueError(f"expected one of {', '.join(option.choices)}, got {value!r}")
    return value


# --- lists and mappings -------------------------------------------------------

def _items(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list, got {value!r}")
    return value


def _int_list(value: Any, option: Option) -> tuple[int, ...]:
    for item in _items(value):
        if isinstance(item, bool) or not isinstance(item, int) or (
                option.lo and item < option.lo):
            raise ValueError(f"expected positive integers, got {item!r}")
        if item > INT32_MAX:  # a pid_t: larger ones overflow the BPF map's key
            raise ValueError(f"{item!r} is larger than {INT32_MAX}")
    return tuple(value)


def _string(item: Any) -> str:
    if not isinstance(item, str):
        raise ValueError(f"expected strings, got {item!r}")
    return item


def _str_list(value: Any, option: Option) -> tuple[str, ...]:
    return tuple(_string(item) for item in _items(value))


def _regex(pattern: str, used_as: str = "{}") -> None:
    """ValueError unless ``pattern`` compiles as it will be used (``used_as``
    holds it): re.compile also raises RecursionError (deeply nested groups)
    and OverflowError (a{99999999999})."""
    try:
        re.compile(used_as.format(pattern))
    except (re.error, RecursionError, OverflowError) as exc:
        used = "" if used_as == "{}" else f" (used as {used_as.format(pattern)!r})"
        raise ValueError(f"bad regular expression {pattern!r}{used}: {exc}") from None


def _regex_list(value: Any, option: Option) -> tuple[str, ...]:
    for item in _items(value):
        _regex(_string(item))
    return tuple(value)


def _type_list(value: Any, option: Option) -> tuple[str, ...]:
    """true (every choice), false (none) or a list of choices, deduplicated."""
    if isinstance(value, bool):
        return option.choices if value else ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"expected true, false or a list of {option.item}s, got {value!r}")
    bad = [v for v in value if v not in option.choices]
    if bad:
        raise ValueError(f"unknown {option.item} {bad[0]!r} (one of {', '.join(option.choices)})")
    return tuple(dict.fromkeys(value))


def _render_type_list(value: Any, option: Option) -> str:
    return "true" if value == option.choices else "[" + ", ".join(value) + "]"


def _labels(value: Any, option: Option) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of label names to values, got {value!r}")
    for k, v in value.items():
        if not isinstance(k, str) or not _LABEL_NAME.match(k) or k.startswith("__"):
            raise ValueError(f"not a valid label name: {k!r}")
        if not isinstance(v, (str, int, float)) or isinstance(v, bool):
            raise ValueError(f"label {k} needs a string value, got {v!r}")
    return tuple(sorted((k, str(v)) for k, v in value.items()))


def _relabel(value: Any, option: Option) -> tuple[Rule, ...]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list of relabel rules, got {value!r}")
    return tuple(_rule(i + 1, item) for i, item in enumerate(value))


def _rule(number: int, item: Any) -> Rule:
    if not isinstance(item, dict):
        raise ValueError(f"rule {number}: expected a mapping, got {item!r}")
    allowed = {f.name for f in fields(Rule)}
    unknown = [k for k in item if k not in allowed]
    if unknown:
        raise ValueError(f"rule {number}: unknown key {unknown[0]!r} "
                         f"(known: {', '.join(sorted(allowed))})")
    args = dict(item)
    if "source_labels" in args:
        if not isinstance(args["source_labels"], list) or not all(
                isinstance(x, str) for x in args["source_labels"]):
            raise ValueError(f"rule {number}: source_labels must be a list of names")
        args["source_labels"] = tuple(args["source_labels"])
    for k in _RULE_STRINGS:
        if k in args and not isinstance(args[k], str):
            raise ValueError(f"rule {number}: {k} must be a string")
    try:
        # as relabeling compiles it: (?i) is valid alone, not after ^(?:
        _regex(args.get("regex", Rule.regex), "^(?:{})$")
        return Rule(**args)
    except ValueError as exc:
        raise ValueError(f"rule {number}: {exc}") from None


#: Every kind of option, by the name the schema and the reference use.
KINDS: dict[str, Kind] = {
    "bool": Kind(_bool, lambda v, _: "true" if v else "false"),
    "int": Kind(_int, ranged=True),
    "duration": Kind(lambda v, _: parse_duration(v), lambda v, _: render_duration(v),
                     ranged=True),
    "size": Kind(lambda v, _: parse_size(v), lambda v, _: render_size(v), ranged=True),
    "hostport": Kind(_hostport),
    "path": Kind(_path),
    "str": Kind(_str),
    "choice": Kind(_choice),
    "int_list": Kind(_int_list, _render_list),
    "str_list": Kind(_str_list, _render_list),
    "regex_list": Kind(_regex_list, _render_list),
    "type_list": Kind(_type_list, _render_type_list),
    "labels": Kind(_labels, _render_list),
    "relabel": Kind(_relabel, _render_list),
}
