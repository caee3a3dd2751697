"""What ember knows about one config key, kept on the key: its documentation,
its kind (how a YAML value becomes a typed one, see ``kinds``), its range or
choices, and whether SIGHUP may change it. A key whose type is itself a
dataclass is a section, a nested mapping: the type says so, not a table."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

#: The dataclass field metadata entry holding a key's ``Option``.
OPTION = "option"


@dataclass(frozen=True)
class Option:
    doc: str
    kind: str                       # a name in kinds.KINDS, or "section"
    lo: float | None = None         # bounds of the value (ranged kinds) or its items
    hi: float | None = None
    choices: tuple[str, ...] = ()   # what a list of names may hold
    reloadable: bool = False        # SIGHUP applies it; otherwise it needs a restart
    item: str = "profile type"      # what one of the choices is called, in messages


def opt(doc: str, kind: str, lo: float | None = None, hi: float | None = None,
        choices: tuple[str, ...] = (), *, reloadable: bool = False,
        item: str = "profile type") -> Mapping[str, Option]:
    """The metadata of a dataclass field that is a config key."""
    return {OPTION: Option(doc, kind, lo, hi, choices, reloadable, item)}


def section(doc: str, *, reloadable: bool = False) -> Mapping[str, Option]:
    """The metadata of a field holding a nested section (a dataclass)."""
    return {OPTION: Option(doc, "section", reloadable=reloadable)}


@dataclass(frozen=True)
class Key:
    """One key of a section, as loading and the reference see it."""

    name: str
    option: Option
    default: Any
    section: type[Any] | None       # the nested section's class, if it is one


def keys_of(cls: type[Any]) -> tuple[Key, ...]:
    """The keys of a section class, in the order the file documents them."""
    hints = typing.get_type_hints(cls)
    defaults = cls()
    return tuple(Key(f.name, f.metadata[OPTION], getattr(defaults, f.name),
                     _section_type(hints[f.name]))
                 for f in fields(cls))


def _section_type(hint: Any) -> type[Any] | None:
    return hint if isinstance(hint, type) and is_dataclass(hint) else None
