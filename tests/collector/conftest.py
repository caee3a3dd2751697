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
