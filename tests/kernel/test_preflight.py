from __future__ import annotations

from pathlib import Path

import pytest

from ember.errors import KernelHeadersError, PrivilegeError
from ember.kernel import preflight as host


def test_privileges() -> None:
    with pytest.raises(PrivilegeError, match="CAP_BPF and CAP_PERFMON"):
        host.check_privileges(caps=0)
    with pytest.raises(PrivilegeError, match="missing capability CAP_PERFMON:"):
        host.check_privileges(caps=1 << host.CAP_BPF)
    host.check_privileges(caps=(1 << host.CAP_BPF) | (1 << host.CAP_PERFMON))
    host.check_privileges(caps=1 << host.CAP_SYS_ADMIN)


def test_effective_capabilities(tmp_path: Path) -> None:
    f = tmp_path / "status"
    f.write_text("Name:\tx\nCapEff:\t000001c000000000\n")
    caps = host.effective_capabilities(f)
    assert caps & (1 << host.CAP_BPF) and caps & (1 << host.CAP_PERFMON)


def test_missing_headers_say_what_to_install(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BCC_KERNEL_SOURCE", raising=False)
    with pytest.raises(KernelHeadersError, match=r"install linux-headers-9\.9\.9"):
        host.check_kernel_headers("9.9.9", modules=tmp_path, kheaders=tmp_path / "none")
    (tmp_path / "9.9.9" / "build" / "include").mkdir(parents=True)
    host.check_kernel_headers("9.9.9", modules=tmp_path, kheaders=tmp_path / "none")
    monkeypatch.setenv("BCC_KERNEL_SOURCE", str(tmp_path / "missing"))
    with pytest.raises(KernelHeadersError, match="not a directory"):
        host.check_kernel_headers("9.9.9", modules=tmp_path)
