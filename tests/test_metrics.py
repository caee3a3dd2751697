"""docs/metrics.md is generated from the metrics module and kept current."""

from __future__ import annotations

import re

from ember import metrics
from tests.support import ROOT


def test_metrics_reference_is_current() -> None:
    assert (ROOT / "docs/metrics.md").read_text() == metrics.reference(), \
        "docs/metrics.md is stale: run `ember metrics-reference > docs/metrics.md`"


def test_docs_name_only_real_metrics() -> None:
    """Every ember_* metric the other docs mention exists."""
    known = set(re.findall(r"`(ember_[a-z_]+)`", metrics.reference()))
    # the BPF side's maps and functions are named ember_* too
    bpf_names = {name for path in (ROOT / "bpf").iterdir()
                 for name in re.findall(r"\b(ember_[a-z_0-9]+)\b", path.read_text())}
    for doc in ("install.md", "troubleshooting.md", "design.md"):
        text = (ROOT / "docs" / doc).read_text()
        for name in re.findall(r"\b(ember_[a-z_]+?)(?:\{|\b)", text):
            if name in bpf_names or name.startswith(("ember_process", "ember_stacks_",
                                                        "ember_tstacks", "ember_ustacks",
                                                        "ember_cpu", "ember_offcpu",
                                                        "ember_runqlat", "ember_wakeup",
                                                        "ember_offwake")):
                continue
            assert name in known, f"{doc} names {name}, which ember does not export"
