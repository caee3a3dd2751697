"""Relabeling behaves as Prometheus's relabel_configs."""

from __future__ import annotations

import pytest

from ember.agent.relabel import relabel
from ember.config import Rule

BASE = {"__name__": "ember_cpu", "pid": "42", "comm": "nginx", "namespace": "web",
        "pod": "nginx-7d9f", "container": "nginx", "pod_label_app": "nginx",
        "pod_label_pod_template_hash": "7d9f"}


def test_replace_with_groups() -> None:
    rules = [Rule(source_labels=("namespace", "pod"), regex="(.+);(.+)-[0-9a-f]+",
                  target_label="workload", replacement="$1/${2}")]
    assert relabel(BASE, rules)["workload"] == "web/nginx"  # type: ignore[index]


def test_replace_without_match_leaves_labels() -> None:
    rules = [Rule(source_labels=("comm",), regex="postgres", target_label="db")]
    assert relabel(BASE, rules) == BASE


def test_keep_and_drop() -> None:
    assert relabel(BASE, [Rule(source_labels=("namespace",), regex="kube-.*",
                               action="drop")]) == BASE
    assert relabel(BASE, [Rule(source_labels=("namespace",), regex="web",
                               action="drop")]) is None
    assert relabel(BASE, [Rule(source_labels=("namespace",), regex="prod",
                               action="keep")]) is None


def test_labelmap_labeldrop_labelkeep() -> None:
    out = relabel(BASE, [Rule(regex="pod_label_(.+)", replacement="app_$1", action="labelmap"),
                         Rule(regex="pod_label_.*", action="labeldrop")])
    assert out is not None and out["app_app"] == "nginx" and "pod_label_app" not in out
    kept = relabel(BASE, [Rule(regex="pid|comm", action="labelkeep")])
    assert kept == {"__name__": "ember_cpu", "pid": "42", "comm": "nginx"}


def test_empty_value_removes_label_and_private_labels_never_leave() -> None:
    out = relabel(BASE, [Rule(source_labels=("comm",), target_label="comm", replacement=""),
                         Rule(source_labels=("pid",), target_label="__tmp", replacement="x")])
    assert out is not None and "comm" not in out and "__tmp" not in out


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"action": "rename"}, "unknown relabel action"),
    ({"regex": "(", "source_labels": ("a",), "target_label": "b"}, "bad regex"),
    ({"source_labels": ("a",)}, "needs a target_label"),
    ({"action": "keep"}, "needs source_labels"),
])
def test_bad_rules_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Rule(**kwargs)  # type: ignore[arg-type]
