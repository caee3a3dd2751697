"""Durations and sizes read back as they are rendered."""

from __future__ import annotations

import pytest

from ember.config.units import parse_duration, parse_size, render_duration, render_size


@pytest.mark.parametrize("seconds", [0.0, 0.000001, 0.00005, 0.001, 0.25, 1.0, 10.0, 86400.0])
def test_durations_round_trip(seconds: float) -> None:
    assert parse_duration(render_duration(seconds)) == pytest.approx(seconds)


@pytest.mark.parametrize("size", [0, 1, 4097, 1 << 10, 3 << 20, 150 << 20, 1 << 30, 5 << 40])
def test_sizes_round_trip(size: int) -> None:
    assert parse_size(render_size(size)) == size
