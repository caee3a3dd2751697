"""Encoders: model.Profile -> folded stacks, pprof."""
