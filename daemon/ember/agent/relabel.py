"""Prometheus-style relabeling of profile labels.

Rules run in order over each profile's label set (host, pid, comm,
executable, build_id, cgroup, container_id, and on Kubernetes namespace,
pod, container and pod_label_*), as Prometheus's relabel_configs do:

- replace: join source_labels with separator; if regex matches the whole
  string, set target_label to replacement (``$1``, ``${name}`` expand);
- keep / drop: keep or drop the whole profile when regex matches;
- labelmap: copy labels whose name matches to the replacement name;
- labeldrop / labelkeep: remove labels whose name matches / does not.

A label set with an empty value drops that label, and labels starting with
``__`` (other than ``__name__``) never leave the agent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ..cache import BoundedCache
from ..config import Rule

_REF = re.compile(r"\$(\d+)|\$\{(\w+)\}")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

_PATTERNS: BoundedCache[str, re.Pattern[str]] = BoundedCache("relabel_patterns", 1024)


def _compiled(regex: str) -> re.Pattern[str]:
    p = _PATTERNS.get(regex)
    if p is None:
        p = _PATTERNS.put(regex, re.compile(f"^(?:{regex})$"))
    return p


def _expand(template: str, m: re.Match[str]) -> str:
    def ref(r: re.Match[str]) -> str:
        key = r.group(1) or r.group(2)
        try:
            return m.group(int(key) if key.isdigit() else key) or ""
        except IndexError:  # no such group: empty, as in Prometheus
            return ""
    return _REF.sub(ref, template)


def relabel(labels: Mapping[str, str], rules: Sequence[Rule]) -> dict[str, str] | None:
    """The labels after the rules, or None when a keep/drop rule drops them."""
    out = dict(labels)
    for rule in rules:
        p = _compiled(rule.regex)
        if rule.action in ("replace", "keep", "drop"):
            value = rule.separator.join(out.get(name, "") for name in rule.source_labels)
            m = p.match(value)
            if rule.action == "keep" and not m:
                return None
            if rule.action == "drop" and m:
                return None
            if rule.action == "replace" and m:
                target = _expand(rule.target_label, m)
                new = _expand(rule.replacement, m)
                if not _LABEL_NAME.match(target):
                    continue
                if new:
                    out[target] = new
                else:
                    out.pop(target, None)
        elif rule.action == "labelmap":
            for name, value in list(out.items()):
                m = p.match(name)
                if m:
                    target = _expand(rule.replacement, m)
                    if _LABEL_NAME.match(target):
                        out[target] = value
        elif rule.action == "labeldrop":
            out = {k: v for k, v in out.items() if not p.match(k)}
        elif rule.action == "labelkeep":
            out = {k: v for k, v in out.items() if p.match(k) or k == "__name__"}
    return {k: v for k, v in out.items() if v and (k == "__name__" or not k.startswith("__"))}
