from __future__ import annotations

from pathlib import Path

import pytest

from ember.errors import SymbolizationError
from ember.symbols.kallsyms import KernelSymbols


def test_lookup(tmp_path: Path) -> None:
    f = tmp_path / "kallsyms"
    f.write_text("ffffffff81000000 T _stext\nffffffff81000100 t helper\n"
                 "ffffffff81000200 D some_data\nffffffffc0000000 t ext4_read\t[ext4]\n")
    k = KernelSymbols(f)
    assert len(k) == 3
    assert k.lookup(0xFFFFFFFF81000105) == ("helper", 5)
    assert k.lookup(0xFFFFFFFF81000250) == ("helper", 0x150)  # data symbols are skipped
    assert k.lookup(0xFFFFFFFFC0000010) == ("ext4_read [ext4]", 0x10)
    assert k.lookup(0x1000) is None


def test_hidden_addresses_are_reported(tmp_path: Path) -> None:
    f = tmp_path / "kallsyms"
    f.write_text("0000000000000000 T _stext\n0000000000000000 t helper\n")
    with pytest.raises(SymbolizationError, match="kptr_restrict"):
        KernelSymbols(f)
