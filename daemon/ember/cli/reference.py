"""``ember config-reference`` and ``ember metrics-reference``: print the
reference another part of ember generates from its own definitions.

Both commands in one module: they are the same two lines around a different
``reference()``, and take no arguments; a module each would be mostly
docstring."""

from __future__ import annotations

import argparse
import sys

from ._common import Command, no_arguments


def run_config(_args: argparse.Namespace) -> int:
    from ..config import reference

    sys.stdout.write(reference())
    return 0


def run_metrics(_args: argparse.Namespace) -> int:
    from ..metrics import reference

    sys.stdout.write(reference())
    return 0


CONFIG_REFERENCE = Command(name="config-reference", help="print the configuration reference",
                           add_arguments=no_arguments, run=run_config)
METRICS_REFERENCE = Command(name="metrics-reference", help="print the metrics reference",
                            add_arguments=no_arguments, run=run_metrics)
