"""ember's configuration: one typed schema that validates YAML (with the file,
line and key of every mistake), holds the defaults and the documentation,
and renders the reference (docs/configuration.md, checked current by a test).

The package is one pipeline stage split by concern: ``units`` (durations,
sizes, addresses), ``options`` (the facts kept on each key), ``schema`` (the
keys), ``kinds`` (one converter per kind of value), ``load`` (YAML to typed
config) and ``reference`` (the Markdown). This module only names what the
rest of ember imports, so callers never depend on that layout.
"""

from __future__ import annotations

from .load import load, loads, override, read_token
from .reference import reference
from .schema import (
    EXPORTERS,
    PROFILE_TYPES,
    RELABEL_ACTIONS,
    AgentConfig,
    CollectorConfig,
    Config,
    KubernetesConfig,
    Rule,
    Targets,
    fixed_changes,
    reloadable_keys,
)
from .units import parse_duration, parse_hostport, parse_size

__all__ = [
    "EXPORTERS", "PROFILE_TYPES", "RELABEL_ACTIONS", "AgentConfig", "CollectorConfig", "Config",
    "KubernetesConfig", "Rule", "Targets", "fixed_changes", "load", "loads", "override",
    "parse_duration", "parse_hostport", "parse_size", "read_token", "reference",
    "reloadable_keys",
]
