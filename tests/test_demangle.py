from ember.demangle import demangle


def test_cpp_names() -> None:
    assert demangle("_ZN10ember_test11AccumulatorImEclEm") == \
        "ember_test::Accumulator<unsigned long>::operator()(unsigned long)"
    assert demangle("_ZN10ember_test6detail5churnImEEvRNS_11AccumulatorIT_EE") == \
        "void ember_test::detail::churn<unsigned long>(ember_test::Accumulator<unsigned long>&)"


def test_non_mangled_and_invalid_names_unchanged() -> None:
    assert demangle("main") == "main"
    assert demangle("_Zgarbage(") == "_Zgarbage("
