from ember.demangle import demangle


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
    # a C++ name that merely contains 'h' and hex is left alone
    assert demangle("_ZN3foo3barEv") == "foo::bar()"


def test_non_mangled_and_invalid_names_unchanged() -> None:
    assert demangle("main") == "main"
    assert demangle("_Zgarbage(") == "_Zgarbage("
