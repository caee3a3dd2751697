"""Flame graphs: stacks from files, profiles or a collector, rendered as
self-contained interactive SVG (the CLI and the web UI)."""
