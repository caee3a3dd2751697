"""The Markdown reference of every key (docs/configuration.md), generated from
the schema so the documentation cannot drift from what is accepted; a test
fails when the checked-in file is stale."""

from __future__ import annotations

from typing import Any

from .kinds import render
from .options import Key, keys_of
from .schema import Config

_PREAMBLE = [
    "# Configuration reference", "",
    "Generated from `daemon/ember/config/schema.py` (`ember config-reference`); "
    "`tests/config/test_config.py` fails when this file is stale.", "",
    "Durations take `us`, `ms`, `s`, `m`, `h`, `d` suffixes; sizes take `KiB`, `MiB`, "
    "`GiB`. Command-line flags override the file.", ""]
_RELOADABLE = " Reloaded on SIGHUP."


def reference() -> str:
    """Markdown reference of every key, generated from the schema."""
    out = list(_PREAMBLE)
    for key in keys_of(Config):
        assert key.section is not None, "the top level holds only sections"
        out.extend([f"# `{key.name}`", "", key.option.doc, ""])
        out.extend(_section(key.section, key.name))
    return "\n".join(out).rstrip() + "\n"


def _section(cls: type[Any], prefix: str) -> list[str]:
    """A section's table of plain keys, then each nested section."""
    out = []
    rows = [_row(key, f"{prefix}.{key.name}") for key in keys_of(cls) if key.section is None]
    if rows:
        out.extend([f"## {prefix}", "", "| key | type | default | meaning |",
                    "|---|---|---|---|", *rows, ""])
    for key in keys_of(cls):
        if key.section is not None:
            name = f"{prefix}.{key.name}"
            out.extend([f"### {name}", "", _meaning(key), ""])
            out.extend(_section(key.section, name))
    return out


def _row(key: Key, name: str) -> str:
    option = key.option
    return (f"| `{name}` | {option.kind} | `{render(option, key.default)}` | "
            f"{_meaning(key)} |")


def _meaning(key: Key) -> str:
    option = key.option
    rng = ""
    if option.lo is not None or option.hi is not None:
        rng = f" Range: {option.lo} to {option.hi}."
    return option.doc + rng + (_RELOADABLE if option.reloadable else "")
