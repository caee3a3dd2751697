"""YAML to the typed config. Every mistake is one line, ``FILE:LINE: KEY:
problem``, so a bad file is fixed in one look: the YAML is composed into
nodes (which know their line) and walked along the schema's keys, each value
converted by its kind.

KEY is the dotted key (``agent.targets.comm``), ``(top level)`` for the
document itself, and ``(yaml)`` when the text is not YAML or is YAML that
ember refuses; LINE is then where the parser stopped. Only a file that cannot
be read at all has no line (``FILE: cannot read: ...``).

The file may come from anyone who can write it, and SIGHUP re-reads it in a
running agent, so loading is bounded: the text's size, the nesting, and the
nodes walked, aliases counted each time they are used (a "billion laughs"
of a few hundred bytes would otherwise expand to gigabytes). Only the plain
YAML types are built; any other tag (``!foo``, ``!!python/...``,
``!!binary``), and merge keys (``<<``), are errors. Loading raises nothing
but ConfigError.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import yaml
from yaml.composer import ComposerError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.scanner import ScannerError

from ..errors import ConfigError
from .kinds import convert
from .options import Key, keys_of
from .schema import Config

_Section = TypeVar("_Section")

#: Nodes composed, and nodes walked (each alias as often as it is used), per
#: file. ember's whole config is a few hundred; this is far above any real
#: one and far below what hurts (10,000 small values take a few MiB).
MAX_NODES = 10_000
#: Nesting of collections. The deepest key is agent.relabel[i].source_labels
#: (four levels); PyYAML's composer recurses, and its scanner slows down
#: quadratically with nested flow collections.
MAX_DEPTH = 32
#: Characters of a config file: the documented defaults are about 6 KiB.
MAX_TEXT = 1 << 20
#: Characters of a number as written. Longer is no config value, and Python's
#: int() of a long one is slow (sexagesimal 1:2:3...) or refused (4300 digits).
MAX_NUMBER = 40

_YAML = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_YAML + t for t in ("str", "int", "float", "bool", "null", "timestamp")}
_NUMBER_TAGS = {_YAML + "int", _YAML + "float"}
_RESOLVER = yaml.resolver.Resolver()
_NAME = re.compile(r"\w+")
_BAD_CHARACTERS = re.compile("[\x00\ud800-\udfff]")


def load(path: str | Path | None) -> Config:
    """Read and validate a config file; no file means all defaults."""
    if path is None:
        return Config()
    p = str(path)
    try:
        data = Path(p).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from exc
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{p}:{line}: (yaml): not a text file: byte "
                          f"0x{data[exc.start]:02x} is not UTF-8") from None
    return loads(text, p)


def loads(text: str, path: str = "<config>") -> Config:
    """Validate config text; ``path`` names it in errors."""
    if len(text) > MAX_TEXT:
        raise ConfigError(f"{path}:{_line_at(text, MAX_TEXT)}: (yaml): longer than "
                          f"{MAX_TEXT} characters; no config is this long")
    try:
        node = _Loader(text).get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        problem = exc.problem or exc.context or "not YAML"
        raise ConfigError(f"{path}:{line}: (yaml): {_clip(problem)}") from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise ConfigError(f"{path}:{_line_at(text, exc.position)}: (yaml): character "
                          f"U+{char:04X} is not allowed in YAML") from None
    return _Walk(path).section(Config, node, "")


def read_token(path: str) -> str:
    """A bearer token from a file ('' when no file is configured)."""
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read token file: {exc.strerror}") from exc


def override(section: Any, **values: Any) -> Any:
    """A copy of a config section with the non-None values replaced."""
    return replace(section, **{k: v for k, v in values.items() if v is not None})


def _line_at(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _clip(problem: str, limit: int = 300) -> str:
    """One line of bounded length: a value shown in a message may be huge."""
    one = " ".join(problem.split("\n"))
    return one if len(one) <= limit else one[:limit] + "..."


class _Loader(yaml.SafeLoader):
    """PyYAML's safe composer with the size of what it composes bounded."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.composed = 0
        self.depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
        self.composed += 1
        if self.composed > MAX_NODES:
            raise ComposerError(None, None, f"more than {MAX_NODES} values", mark)
        if self.depth >= MAX_DEPTH:
            raise ComposerError(None, None, f"nested more than {MAX_DEPTH} deep", mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        if self.flow_level >= MAX_DEPTH:
            raise ScannerError(None, None, f"nested more than {MAX_DEPTH} deep",
                               self.get_mark())
        super().fetch_flow_collection_start(token_class)


class _Walk:
    """One walk over a composed file: the file's name for messages, and the
    node budget that every value shares, so an alias used a million times
    costs a million."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.walked = 0
        self.constructor = yaml.SafeLoader("")     # builds plain scalars only

    def error(self, node: Node, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.path}:{node.start_mark.line + 1}: {key}: {_clip(problem)}")

    def section(self, cls: type[_Section], node: Node | None, key: str) -> _Section:
        """A section from a mapping node; absent or null means its defaults."""
        where = key or "(top level)"
        if node is None:
            return cls()
        self._count(node, where)
        if isinstance(node, ScalarNode) and node.tag == _YAML + "null":
            return cls()
        if not isinstance(node, MappingNode) or node.tag != _YAML + "map":
            self._check_tag(node, where)
            raise self.error(node, where, "expected a mapping")
        known = {k.name: k for k in keys_of(cls)}
        values: dict[str, Any] = {}
        for key_node, value_node in node.value:
            name = self.plain(key_node, where, 0)
            if not isinstance(name, str):  # a number, a list or a mapping as a key
                raise self.error(key_node, where, f"a key must be a name, not {name!r}")
            dotted = f"{key}.{name}" if key else name
            if name not in known:
                hint = ", ".join(sorted(known))
                if not _NAME.fullmatch(name):  # not to be read as part of FILE:LINE: KEY:
                    raise self.error(key_node, where, f"unknown key {name!r} (known: {hint})")
                raise self.error(key_node, dotted, f"unknown key (known: {hint})")
            if name in values:
                raise self.error(key_node, dotted, "duplicate key")
            values[name] = self._value(known[name], value_node, dotted)
        return cls(**values)

    def _value(self, key: Key, node: Node, dotted: str) -> Any:
        if key.section is not None:
            return self.section(key.section, node, dotted)
        value = self.plain(node, dotted, 0)
        try:
            return convert(key.option, value)
        except (ValueError, ArithmeticError) as exc:
            raise self.error(node, dotted, str(exc)) from None

    def plain(self, node: Node, key: str, depth: int) -> Any:
        """A node as plain Python values: str, int, float, bool, None, date,
        list and dict (keyed by scalars, no duplicates)."""
        self._count(node, key)
        if depth > MAX_DEPTH:  # only aliases nest this deep: the composer stops sooner
            raise self.error(node, key, f"aliases nest more than {MAX_DEPTH} deep")
        self._check_tag(node, key)
        if isinstance(node, ScalarNode):
            return self._scalar(node, key)
        if isinstance(node, SequenceNode):
            return [self.plain(item, key, depth + 1) for item in node.value]
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            k = self.plain(key_node, key, depth + 1)
            if isinstance(k, (list, dict)):
                raise self.error(key_node, key, f"a key must be a name, not {k!r}")
            if k in out:
                raise self.error(key_node, key, f"duplicate key {k!r}")
            out[k] = self.plain(value_node, key, depth + 1)
        return out

    def _scalar(self, node: ScalarNode, key: str) -> Any:
        if node.tag in _NUMBER_TAGS and len(node.value) > MAX_NUMBER:
            raise self.error(node, key, f"a number of more than {MAX_NUMBER} characters")
        if node.tag != _YAML + "str" and not _reads_as(node):
            raise self.error(node, key, f"{node.value!r} is not a valid {_short(node.tag)}")
        try:
            value = self.constructor.construct_object(node)
        except (ValueError, ArithmeticError) as exc:  # e.g. a timestamp on February 30
            raise self.error(node, key, f"{node.value!r}: {exc}") from None
        if isinstance(value, str) and _BAD_CHARACTERS.search(value):
            raise self.error(node, key, f"{value!r} holds a NUL or a lone surrogate; "
                             "no value may")
        return value

    def _check_tag(self, node: Node, key: str) -> None:
        if node.tag == _YAML + "merge":
            raise self.error(node, key, "merge keys (<<) are not supported")
        expected = ({_YAML + "seq"} if isinstance(node, SequenceNode) else
                    {_YAML + "map"} if isinstance(node, MappingNode) else _SCALAR_TAGS)
        if node.tag not in expected:
            raise self.error(node, key, f"unsupported YAML tag {_short(node.tag)}")

    def _count(self, node: Node, key: str) -> None:
        self.walked += 1
        if self.walked > MAX_NODES:
            raise self.error(node, key, f"more than {MAX_NODES} values, counting each use "
                             "of an alias; no config is this large")


def _reads_as(node: ScalarNode) -> bool:
    """Whether an explicitly tagged scalar is written as its tag's type would
    be without the tag (!!int 12, !!float 1): PyYAML's constructors assume so,
    and fail with any exception otherwise (!!bool maybe, !!timestamp x)."""
    implicit = _RESOLVER.resolve(  # type: ignore[no-untyped-call]
        ScalarNode, node.value, (True, False))
    return implicit == node.tag or (implicit, node.tag) == (_YAML + "int", _YAML + "float")


def _short(tag: str) -> str:
    """A tag as it is written: !!int, !foo."""
    return "!!" + tag.removeprefix(_YAML) if tag.startswith(_YAML) else tag
