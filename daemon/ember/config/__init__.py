"""ember's configuration: one typed schema that validates YAML (with the file,
line and key of every mistake), holds the defaults and the documentation,
and renders the reference (docs/configuration.md, checked current by a test).

This package is a pipeline stage split by concern; this module only names
what the rest of ember imports, so callers never depend on the layout.
"""

from __future__ import annotations

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
    load,
    loads,
    override,
    parse_duration,
    parse_hostport,
    parse_size,
    read_token,
    reference,
)

__all__ = [
    "EXPORTERS", "PROFILE_TYPES", "RELABEL_ACTIONS", "AgentConfig", "CollectorConfig", "Config",
    "KubernetesConfig", "Rule", "Targets", "load", "loads", "override", "parse_duration",
    "parse_hostport", "parse_size", "read_token", "reference",
]
