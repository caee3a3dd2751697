"""Label matchers: which stored series a query reads.

The syntax is Prometheus's, one matcher per ``match=`` parameter:
``LABEL=VALUE``, ``LABEL!=VALUE``, ``LABEL=~REGEX``, ``LABEL!~REGEX``, with
regular expressions anchored at both ends. Matchers all have to hold, with one
exception that is what a person picking several values means: several
``LABEL=VALUE`` on one label match any of those values (``host=a&host=b`` is
both hosts, not none). A label a series does not carry is the empty string,
so ``pod!=x`` keeps series without a pod and ``pod=`` selects them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Matcher", "Matchers", "Selector", "parse", "selector"]

#: A regular expression is compiled from a request: long ones are refused
#: rather than left to backtrack over every series.
MAX_REGEX = 256
# label, operator (the two-character ones first: ``a!=b`` is ``a`` != ``b``,
# not ``a!`` = ``b``), value
_SPLIT = re.compile(r"^([^=!~]+)(=~|!~|!=|=)(.*)$", re.DOTALL)


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str
    regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def holds(self, labels: Mapping[str, str]) -> bool:
        have = labels.get(self.label, "")
        if self.op == "=":
            return have == self.value
        if self.op == "!=":
            return have != self.value
        assert self.regex is not None
        return (self.regex.fullmatch(have) is not None) == (self.op == "=~")

    def __str__(self) -> str:
        return f"{self.label}{self.op}{self.value}"


def parse(text: str) -> Matcher:
    """One ``match=`` parameter; ValueError says what is wrong with it."""
    m = _SPLIT.match(text)
    if m is None:
        raise ValueError(f"match must be LABEL=VALUE, LABEL!=VALUE, LABEL=~REGEX or "
                         f"LABEL!~REGEX, not {text[:80]!r}")
    label, op, value = m.groups()
    regex = None
    if op in ("=~", "!~"):
        if len(value) > MAX_REGEX:
            raise ValueError(f"match {label}{op}: a regular expression of at most "
                             f"{MAX_REGEX} characters, not {len(value)}")
        try:
            regex = re.compile(value)
        except re.error as e:
            raise ValueError(f"match {label}{op}{value[:80]!r}: {e}") from None
    return Matcher(label, op, value, regex)


@dataclass(frozen=True)
class Selector:
    """Matchers as a query holds them: sorted, so two requests asking the
    same thing in another order share a cache entry."""
    matchers: tuple[Matcher, ...] = ()

    def holds(self, labels: Mapping[str, str]) -> bool:
        anyof: dict[str, bool] = {}
        for m in self.matchers:
            if m.op == "=":
                anyof[m.label] = anyof.get(m.label, False) or m.holds(labels)
            elif not m.holds(labels):
                return False
        return all(anyof.values())

    def key(self) -> tuple[str, ...]:
        return tuple(str(m) for m in self.matchers)

    def __bool__(self) -> bool:
        return bool(self.matchers)


#: What the store's readers take: a Selector, or {label: value} for equality.
Matchers = Selector | Mapping[str, str]


def selector(spec: Selector | Mapping[str, str] | Iterable[str] | Sequence[Matcher]
             ) -> Selector:
    """A Selector from what callers hold: one already, a {label: value}
    mapping (equality), ``match=`` texts, or matchers."""
    if isinstance(spec, Selector):
        return spec
    if isinstance(spec, Mapping):
        ms = [Matcher(k, "=", v) for k, v in spec.items()]
    else:
        ms = [m if isinstance(m, Matcher) else parse(m) for m in spec if m]
    return Selector(tuple(sorted(ms, key=lambda m: (m.label, m.op, m.value))))


class Matches:
    """The series each selector matched (Store.series_matching), remembered
    until told a series came or went: an answer asks two or three times,
    each a pass over every series' labels (about 1.7 ms of one host's)."""

    MOST = 64   # selectors remembered at most

    def __init__(self) -> None:
        self._changes = 0
        self._memo: tuple[int, dict[tuple[str, ...], list[int]]] = (0, {})

    def changed(self) -> None:
        """A series came or went (the memo is of the count before)."""
        self._changes += 1

    def of(self, sel: Selector, labels: Mapping[int, Mapping[str, str]]) -> list[int]:
        """The numbers of the series in ``labels`` that ``sel`` selects."""
        now, key = self._changes, sel.key()
        at, memo = self._memo
        if at == now and key in memo:
            return list(memo[key])
        got = [num for num, held in list(labels.items()) if sel.holds(held)]
        if at != now or len(memo) >= self.MOST:
            self._memo = at, memo = now, {}
        memo[key] = got
        return list(got)
