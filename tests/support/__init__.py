"""Helpers shared by the tests: paths, fakes, fixtures' writers, running
agents and collectors. Tests import from here, never from each other."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
BIN = FIXTURES / "bin"
SRC = FIXTURES / "src"
GOLDEN = TESTS / "golden"
