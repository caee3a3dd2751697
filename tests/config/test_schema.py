"""Facts kept on the keys: sections come from field types, SIGHUP-reloadable
keys are marked on the key, and the profile kinds come from the registry."""

from __future__ import annotations

import typing
from dataclasses import replace

from ember import config, model
from ember.config.options import keys_of
from ember.config.schema import (
    AgentConfig,
    CollectorConfig,
    Config,
    KubernetesConfig,
    Targets,
    fixed_changes,
    reloadable_keys,
)

#: What the agent's SIGHUP applied before the flag lived on the keys.
RELOADABLE = {"collector", "interval", "targets", "target_refresh", "include_self", "min_block",
              "max_block", "send_timeout", "max_backoff", "token_file", "tls_ca", "labels",
              "relabel", "otlp_endpoint", "otlp_token_file", "otlp_tls_ca",
              "pyroscope_endpoint", "pyroscope_token_file", "pyroscope_basic_auth_user",
              "pyroscope_tenant_id", "pyroscope_tls_ca"}


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


def test_reloadable_keys() -> None:
    assert reloadable_keys() == RELOADABLE
    assert config.reloadable_keys is reloadable_keys
    for cls in (Config, CollectorConfig, KubernetesConfig, Targets):
        assert not any(k.option.reloadable for k in keys_of(cls)), cls


def test_fixed_changes_name_what_needs_a_restart_in_file_order() -> None:
    old = AgentConfig()
    assert fixed_changes(old, old) == []
    reloadable = replace(old, interval=2.0, targets=Targets(pids=(1,)), labels=(("a", "b"),))
    assert fixed_changes(old, reloadable) == []
    both = replace(reloadable, memory_limit=64 << 20, frequency=99, runqlat=True)
    assert fixed_changes(old, both) == ["frequency", "runqlat", "memory_limit"]
    assert fixed_changes(both, old) == ["frequency", "runqlat", "memory_limit"]


def test_reference_marks_reloadable_keys() -> None:
    rows = [line for line in config.reference().splitlines() if line.startswith("| `agent.")]
    marked = {line.split("`")[1].removeprefix("agent.") for line in rows
              if line.endswith("Reloaded on SIGHUP. |")}
    assert marked == RELOADABLE - {"targets"}
    assert "profiled. Filtering happens in the kernel. Reloaded on SIGHUP." in config.reference()


def test_every_profile_kind_has_a_boolean_key() -> None:
    hints = typing.get_type_hints(AgentConfig)
    options = {k.name: k.option for k in keys_of(AgentConfig)}
    for kind in model.PROFILE_KINDS:
        assert hints.get(kind.name) is bool, kind.name
        assert options[kind.name].kind == "bool"


def test_stack_choices_are_the_profile_kinds() -> None:
    assert config.PROFILE_TYPES == model.KIND_NAMES
    options = {k.name: k.option for k in keys_of(AgentConfig)}
    for name in ("kernel_stacks", "user_stacks"):
        assert options[name].choices == model.KIND_NAMES
    assert ", ".join(model.KIND_NAMES) in options["kernel_stacks"].doc


def test_enabled_kinds_in_registry_order() -> None:
    assert AgentConfig().enabled_kinds() == (model.CPU, model.OFFCPU)
    none = replace(AgentConfig(), cpu=False, offcpu=False)
    assert none.enabled_kinds() == ()
    every = config.loads("agent:\n  offwake: true\n  wakeup: true\n  runqlat: true\n").agent
    assert every.enabled_kinds() == model.PROFILE_KINDS
    assert replace(none, offwake=True, cpu=True).enabled_kinds() == (model.CPU, model.OFFWAKE)
