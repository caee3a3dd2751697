import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ember.symbols.demangle import demangle


def test_cpp_names() -> None:
    assert demangle("_ZN10ember_test11AccumulatorImEclEm") == \
        "ember_test::Accumulator<unsigned long>::operator()(unsigned long)"
    assert demangle("_ZN10ember_test6detail5churnImEEvRNS_11AccumulatorIT_EE") == \
        "void ember_test::detail::churn<unsigned long>(ember_test::Accumulator<unsigned long>&)"


def test_rust_legacy() -> None:
    assert demangle("_ZN3std2rt10lang_start17h0123456789abcdefE") == "std::rt::lang_start"
    # escapes: <, >, (, ), { } as $uXX$, and ".." for "::" inside generic arguments
    assert demangle("_ZN4core3ptr85drop_in_place$LT$std..rt..lang_start$LT$$LP$$RP$$GT$"
                    "..$u7b$$u7b$closure$u7d$$u7d$$GT$17h0123456789abcdefE") == \
        "core::ptr::drop_in_place<std::rt::lang_start<()>::{{closure}}>"
    # an element starting with an escape loses the '_' put before it
    assert demangle("_ZN3std2rt10lang_start28_$u7b$$u7b$closure$u7d$$u7d$"
                    "17h0123456789abcdefE") == "std::rt::lang_start::{{closure}}"
    # a C++ name that merely contains 'h' and hex is left alone
    assert demangle("_ZN3foo3barEv") == "foo::bar()"


def test_non_mangled_and_invalid_names_unchanged() -> None:
    assert demangle("main") == "main"
    assert demangle("_Zgarbage(") == "_Zgarbage("


@pytest.mark.parametrize(("mangled", "plain"), [
    ("_RNvCs15kBYyAo9fc_7mycrate7example", "mycrate::example"),
    ("_RNvNtCsbDqzXfLQacH_4core3ptr13drop_in_place", "core::ptr::drop_in_place"),
    ("_RINvNtC3std3mem8align_ofjE", "std::mem::align_of::<usize>"),
    # inherent and trait impls, with a back reference to the crate root
    ("_RNvMNtC7mycrate3fooNtB4_3Bar3new", "<mycrate::Bar>::new"),
    ("_RNvXNtC7mycrate3fooNtB2_3BarNtNtC4core3fmt5Debug3fmt",
     "<mycrate::foo::Bar as core::fmt::Debug>::fmt"),
    # closures, numbered by their disambiguator
    ("_RNCNvC7mycrate4main0", "mycrate::main::{closure#0}"),
    ("_RNCNvC7mycrate4mains_0", "mycrate::main::{closure#1}"),
    # types and consts in generic arguments
    ("_RINvC7mycrate4sizeRShE", "mycrate::size::<&[u8]>"),
    ("_RINvC7mycrate3idxKj2a_E", "mycrate::idx::<42>"),
    ("_RINvC7mycrate1fTlmEE", "mycrate::f::<(i32, u32)>"),
    ("_RINvC1a1fDNtC1b4Iterp4ItemhEL_E", "a::f::<dyn b::Iter<Item = u8>>"),
    ("_RINvC1a1fFUKCjEuE", 'a::f::<unsafe extern "C" fn(usize)>'),
    ("_RNvC7mycrate3foo.llvm.12345", "mycrate::foo"),  # LLVM suffix dropped
])
def test_rust_v0(mangled: str, plain: str) -> None:
    assert demangle(mangled) == plain


@pytest.mark.parametrize("bad", ["_R", "_Rbad", "_RNvC7mycrate", "_RB0_", "_RNvC99abc3foo",
                                 "_RIC1aKj2aE", "_R" + "B_" * 50])
def test_rust_v0_malformed_stays_mangled(bad: str) -> None:
    assert demangle(bad) == bad


@pytest.mark.parametrize("cut", ["_RIC5crateKj1", "_RIC5crateKjn", "_RINvC5crate3fooKj1a"])
def test_rust_v0_const_cut_short_ends(cut: str) -> None:
    """A const argument whose hex digits run to the end of the name (no
    closing '_'): the parser looped past the end for ever, since the empty
    string is in every string."""
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(demangle(cut)), daemon=True)
    t.start()
    t.join(10)
    assert out == [cut]


@given(st.text(alphabet="_RNvCMXYIBEKLsu0123456789abcdefxyzTAFDGpQO", max_size=60))
def test_rust_v0_never_crashes(text: str) -> None:
    demangle("_R" + text)
