"""Shared test fixtures: compiled ground-truth programs and the BPF gate.

Tests marked ``bpf`` load real programs into the running kernel. They need
root; without it they are skipped, unless EMBER_REQUIRE_BPF=1 (what `make
test` sets as root, so CI cannot silently skip them).
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"
BIN = FIXTURES / "bin"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With EMBER_NO_SKIPS=1 (``make test`` as root, so CI) a skipped test
    fails: the set-up installs everything the tests use, so a skip there
    means a real-kernel or real-component test silently did not run."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and os.environ.get("EMBER_NO_SKIPS") == "1" and not hasattr(
            report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped, and EMBER_NO_SKIPS=1 forbids it: {reason}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    if os.environ.get("EMBER_REQUIRE_BPF") == "1":
        return  # let them run and fail loudly
    skip = pytest.mark.skip(reason="BPF integration tests need root")
    for item in items:
        if "bpf" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    """A collector whose query index is built freezes the objects of the
    process it runs in (collector/server.py), here the test's: each test
    leaves them as it found them."""
    yield
    gc.unfreeze()


@pytest.fixture(scope="session")
def fixture_bin() -> Path:
    subprocess.run(["make", "-s", "-C", str(FIXTURES)], check=True)
    return BIN


class Workload:
    def __init__(self, proc: subprocess.Popen[str]):
        self.proc = proc
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("ready "):
            proc.kill()
            raise RuntimeError(f"workload did not start: {line!r}")
        self.pid = int(line.split()[1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def start_workload(fixture_bin: Path, tmp_path: Path) -> Iterator[object]:
    started: list[Workload] = []

    # (``seconds`` is each workload's own lifetime, a guard only: it is
    # killed when the test ends. On a loaded machine, compiling the BPF
    # programs twice took longer than the 30 s it once was. ``comm``: a
    # copy of the program under that name, for a test that picks processes
    # by name: a workload another run left behind, or another test's, has
    # the program's own name)
    def start(name: str, seconds: float = 300, *args: str, comm: str | None = None
              ) -> Workload:
        exe = fixture_bin / name
        if comm is not None:
            (tmp_path / "comm").mkdir(exist_ok=True)
            exe = Path(shutil.copy2(exe, tmp_path / "comm" / comm))
        proc = subprocess.Popen([str(exe), str(seconds), *args],
                                stdout=subprocess.PIPE, text=True)
        w = Workload(proc)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()
