"""YAML to the typed config. Every mistake is one line, ``FILE:LINE: KEY:
problem``, so a bad file is fixed in one look: the YAML is composed into
nodes (which know their line) and walked along the schema's keys, each value
converted by its kind."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ..errors import ConfigError
from .kinds import convert
from .options import Key, keys_of
from .schema import Config

_Section = TypeVar("_Section")


def load(path: str | Path | None) -> Config:
    """Read and validate a config file; no file means all defaults."""
    if path is None:
        return Config()
    p = str(path)
    try:
        text = Path(p).read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text file") from None
    return loads(text, p)


def loads(text: str, path: str = "<config>") -> Config:
    """Validate config text; ``path`` names it in errors."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{line}: invalid YAML: {problem}") from None
    return _build(Config, node, path, "")


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


def _where(path: str, node: yaml.Node | None, key: str) -> str:
    line = f":{node.start_mark.line + 1}" if node is not None else ""
    return f"{path}{line}: {key}"


def _scalar(node: yaml.Node) -> Any:
    return yaml.safe_load(yaml.serialize(node)) if node is not None else None


def _build(cls: type[_Section], node: yaml.Node | None, path: str, prefix: str) -> _Section:
    """A section from a mapping node; absent or null means its defaults."""
    if node is None or (isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")):
        return cls()
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{_where(path, node, prefix or '(top level)')}: expected a mapping")
    known = {k.name: k for k in keys_of(cls)}
    values: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = _scalar(key_node)
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if not isinstance(key, str):  # a list or a mapping as a key
            raise ConfigError(f"{_where(path, key_node, prefix or '(top level)')}: "
                              f"a key must be a name, not {key!r}")
        if key not in known:
            hint = ", ".join(sorted(known))
            raise ConfigError(f"{_where(path, key_node, dotted)}: unknown key (known: {hint})")
        if key in values:
            raise ConfigError(f"{_where(path, key_node, dotted)}: duplicate key")
        values[key] = _value(known[key], value_node, path, dotted)
    return cls(**values)


def _value(key: Key, node: yaml.Node, path: str, dotted: str) -> Any:
    if key.section is not None:
        return _build(key.section, node, path, dotted)
    try:
        return convert(key.option, _scalar(node))
    except ValueError as exc:
        raise ConfigError(f"{_where(path, node, dotted)}: {exc}") from None
