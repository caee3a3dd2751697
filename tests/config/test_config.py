"""The config schema: documented defaults, file:line:key errors, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ember import config
from ember.errors import ConfigError
from tests.support import ROOT


def test_documented_default_file_is_the_default() -> None:
    assert config.load(ROOT / "config/ember.yaml") == config.Config()


def test_reference_doc_is_current() -> None:
    assert (ROOT / "docs/configuration.md").read_text() == config.reference(), \
        "docs/configuration.md is stale: run `ember config-reference > docs/configuration.md`"


def test_values_parse() -> None:
    c = config.loads("agent:\n  interval: 2500ms\n  spool_max_size: 2MiB\n"
                     "  targets:\n    pids: [1, 2]\n    comm: ['^nginx$']\n"
                     "  labels: {env: prod, zone: 3}\ncollector:\n  retention: 2d\n")
    assert c.agent.interval == 2.5 and c.agent.spool_max_size == 2 << 20
    assert c.agent.targets.pids == (1, 2) and not c.agent.targets.whole_host
    assert c.agent.labels == (("env", "prod"), ("zone", "3"))
    assert c.collector.retention == 2 * 86400
    assert config.loads("") == config.Config()


@pytest.mark.parametrize(("text", "message"), [
    ("agent:\n  intervl: 5s\n", "ember.yaml:2: agent.intervl: unknown key"),
    ("agent:\n  interval: soon\n", "ember.yaml:2: agent.interval: not a duration: 'soon'"),
    ("agent:\n  interval: 0.5s\n", "ember.yaml:2: agent.interval: '0.5s' is out of range"),
    ("agent:\n  frequency: high\n", "ember.yaml:2: agent.frequency: expected an integer"),
    ("agent:\n  cpu: 1\n", "ember.yaml:2: agent.cpu: expected true or false"),
    ("agent:\n  collector: nowhere\n", "ember.yaml:2: agent.collector: not HOST:PORT"),
    ("agent:\n\n  targets:\n    pids: [x]\n",
     "ember.yaml:4: agent.targets.pids: expected positive"),
    ("agent:\n  targets:\n    comm: ['(']\n", "agent.targets.comm: bad regular expression"),
    ("agent:\n  labels: {__x: y}\n", "agent.labels: not a valid label name"),
    ("collector:\n  max_storage_size: lots\n", "collector.max_storage_size: not a size"),
    ("agent: 3\n", "ember.yaml:1: agent: expected a mapping"),
    ("agent:\n  cpu: true\n  cpu: false\n", "ember.yaml:3: agent.cpu: duplicate key"),
    ("agent: [\n", "ember.yaml:2: (yaml): "),
    ("agent:\n  kernel_stacks: [cpu, disk]\n",
     "ember.yaml:2: agent.kernel_stacks: unknown profile type 'disk'"),
    ("agent:\n  user_stacks: cpu\n", "agent.user_stacks: expected true, false or a list"),
    ("agent:\n  offcpu_sample: 5s\n", "agent.offcpu_sample: '5s' is out of range"),
])
def test_errors_name_file_line_and_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config.loads(text, "ember.yaml")
    assert message in str(exc.value)


def test_stacks_per_profile_type() -> None:
    agent = config.loads("agent:\n  kernel_stacks: [offcpu, cpu, offcpu]\n"
                         "  user_stacks: false\n").agent
    assert agent.kernel_stacks == ("offcpu", "cpu") and agent.user_stacks == ()
    assert config.loads("agent:\n  kernel_stacks: true\n").agent.kernel_stacks == \
        config.PROFILE_TYPES


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ember.cli", *args], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(("content", "message"), [
    ("agent:\n  bogus: 1\n", ":2: agent.bogus: unknown key"),
    ("agent:\n  interval: 10\n  frequency: '9'\n", ":3: agent.frequency: expected an integer"),
    ("agent:\n  max_backoff: 1 fortnight\n", ":2: agent.max_backoff: not a duration"),
    ("agent:\n  interval: !foo 10s\n", ":2: agent.interval: unsupported YAML tag !foo"),
    (b"agent:\n  spool_dir: /caf\xe9\n", ":2: (yaml): not a text file"),
    (None, "cannot read"),
    (b"\xff\xfe\x00binary", "not a text file"),
])
def test_bad_config_exits_2(tmp_path: Path, content: str | bytes | None, message: str) -> None:
    path = tmp_path / "ember.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    for role in ("agent", "collector"):
        r = run_cli(role, "--config", str(path))
        assert r.returncode == 2, r.stderr
        assert str(path) in r.stderr and message in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="root reads any file")
def test_unreadable_config(tmp_path: Path) -> None:
    path = tmp_path / "ember.yaml"
    path.write_text("agent: {}\n")
    path.chmod(0)
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        sys.executable, "-m", "ember.cli", "collector", "--config", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "cannot read: Permission denied" in r.stderr, r.stderr


def test_bad_flags_exit_2() -> None:
    r = run_cli("agent", "--interval", "forever")
    assert r.returncode == 2 and "not a duration" in r.stderr
    r = run_cli("collector", "--grpc-listen", "0.0.0.0:7070")
    assert r.returncode == 2 and "no token_file is set" in r.stderr


def test_keys_that_are_not_names_and_unknown_exporters() -> None:
    with pytest.raises(ConfigError, match=r"ember.yaml:2: agent: a key must be a name, "
                                          r"not \['a'\]"):
        config.loads("agent:\n  [a]: 1\n", "ember.yaml")
    with pytest.raises(ConfigError, match=r"ember.yaml:1: \(top level\): a key must be a name"):
        config.loads("7: 1\n", "ember.yaml")
    with pytest.raises(ConfigError, match=r"agent.exporters: unknown exporter 'kafka' "
                                          r"\(one of writeraw, otlp, pyroscope\)"):
        config.loads("agent:\n  exporters: [kafka]\n", "ember.yaml")
