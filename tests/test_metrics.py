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
    for doc in ("install.md", "troubleshooting.md", "design.md"):
        text = (ROOT / "docs" / doc).read_text()
        for name in re.findall(r"\b(ember_[a-z_]+?)(?:\{|\b)", text):
            if name.startswith(("ember_process", "ember_stacks_", "ember_counts",
                                "ember_config", "ember_starts", "ember_wakes", "ember_pids",
                                "ember_targets", "ember_cgroups", "ember_blocks", "ember_new_pids",
                                "ember_tstacks", "ember_stats", "ember_runq_hist",
                                "ember_cpu", "ember_offcpu", "ember_runqlat", "ember_wakeup",
                                "ember_offwake", "ember_sampled", "ember_sched",
                                "ember_on_cpu", "ember_capture", "ember_unwind_procs",
                                "ember_ustacks", "ember_unwind_state", "ember_unwind_progs",
                                "ember_unwind_step", "ember_py_procs", "ember_py_threads")):
                continue
            assert name in known, f"{doc} names {name}, which ember does not export"
