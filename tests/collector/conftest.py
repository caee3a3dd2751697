"""Fixtures the collector's tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ember.collector.api import Api
from ember.collector.store import Store


@pytest.fixture
def api() -> Iterator[Api]:
    """The query API over an empty in-memory store (closed after the test)."""
    a = Api(Store(":memory:"))
    yield a
    a.store.close()


@pytest.fixture(params=["c", "sorted"])
def memo_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A test twice: the memos made after it starts in C (_memo.c, the
    installed one), then as sorted arrays (where it was not built)."""
    from ember.collector import memo
    if request.param == "sorted":
        monkeypatch.setattr(memo, "_memo", None)
    return str(request.param)


@pytest.fixture(params=["c", "numpy"])
def scatter_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A test twice: the scattered sums in C (_scatter.c, the installed
    ones), then in numpy (where they were not built)."""
    from ember.collector import scatter
    if request.param == "numpy":
        monkeypatch.setattr(scatter, "_scatter", None)
        monkeypatch.setattr(scatter, "IN_C", False)
    else:
        assert scatter.IN_C
    return str(request.param)
