"""Language runtimes whose frames ember reads: CPython today."""
