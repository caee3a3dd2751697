"""The CPython interpreters on this machine: Debian's own and pyenv's."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

DEBIAN_311 = Path("/usr/bin/python3.11")


def pyenv_root() -> Path:
    """`pyenv root` when pyenv is on PATH, else $PYENV_ROOT or ~/.pyenv."""
    pyenv = shutil.which("pyenv")
    if pyenv is not None:
        out = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False)
        if out.returncode == 0 and out.stdout.strip():
            return Path(out.stdout.strip())
    return Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")


def pyenv_python(short: str) -> Path | None:
    """pyenv's newest python<short> (e.g. "3.12"), if installed."""
    versions = sorted((pyenv_root() / "versions").glob(f"{short}.*"),
                      key=lambda p: [int(x) for x in p.name.split(".") if x.isdigit()])
    for v in reversed(versions):
        exe = v / "bin" / f"python{short}"
        if exe.exists():
            return exe
    return None
