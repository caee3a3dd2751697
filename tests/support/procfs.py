"""A fake /proc tree for the symbolizer's unit tests."""

from __future__ import annotations

from pathlib import Path


def write_proc(root: Path, pid: int, maps: str, comm: str = "app", flags: int = 0) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "maps").write_text(maps)
    fields = ["S", "1", "1", "1", "0", "-1", str(flags)] + ["0"] * 12 + ["4242"] + ["0"] * 30
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields))
