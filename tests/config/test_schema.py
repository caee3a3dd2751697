"""Facts kept on the keys: sections come from field types, defaults from the
dataclasses."""

from __future__ import annotations

from ember.config.options import keys_of
from ember.config.schema import (
    AgentConfig,
    CollectorConfig,
    Config,
    KubernetesConfig,
    Targets,
)


def test_sections_come_from_field_types() -> None:
    assert {k.name: k.section for k in keys_of(Config)} == \
        {"agent": AgentConfig, "collector": CollectorConfig}
    assert {k.name: k.section for k in keys_of(AgentConfig) if k.section} == \
        {"kubernetes": KubernetesConfig, "targets": Targets}
    for cls in (Config, AgentConfig, CollectorConfig, KubernetesConfig, Targets):
        for key in keys_of(cls):
            assert (key.option.kind == "section") == (key.section is not None), key.name


def test_keys_carry_their_defaults() -> None:
    assert {k.name: k.default for k in keys_of(AgentConfig)} == vars(AgentConfig())

