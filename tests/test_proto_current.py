"""The committed *_pb2 modules are what the pinned grpcio-tools makes of the
committed .proto files (run `make proto` after changing either)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

DAEMON = ROOT / "daemon"


@pytest.mark.parametrize("proto", sorted(p.name for p in (DAEMON / "ember/proto").glob("*.proto")))
def test_generated_code_is_current(proto: str, tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={tmp_path}",
                    f"--pyi_out={tmp_path}", f"ember/proto/{proto}"], cwd=DAEMON, check=True)
    stem = proto.removesuffix(".proto")
    for suffix in ("_pb2.py", "_pb2.pyi"):
        fresh = (tmp_path / "ember/proto" / f"{stem}{suffix}").read_text()
        committed = (DAEMON / "ember/proto" / f"{stem}{suffix}").read_text()
        assert fresh == committed, f"{stem}{suffix} is stale: run `make proto`"
