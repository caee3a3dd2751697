"""Profiles through a real (in-memory) store, as the collector serves them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ember.collector.api import Api
from ember.collector.query import FORMATS
from ember.collector.store import Store, StoredProfile
from ember.collector.validate import INT64_MAX


def served(stored: Sequence[StoredProfile], copies: int = 1) -> tuple[dict[str, bytes], Api]:
    """Every rendering (folded, pprof, json) of the stored profiles merged,
    each stored ``copies`` times under its own id; and the API over them
    (close ``api.store`` when done)."""
    store = Store(":memory:")
    store.write([replace(p, profile_id=f"{p.profile_id}-{i}")
                 for i in range(copies) for p in stored])
    api = Api(store)
    q = {"from": ["0"], "to": [str(INT64_MAX)], "type": [stored[0].type]}
    out = {}
    for fmt in FORMATS:
        code, body, _ = api.handle("/api/v1/profile", {**q, "format": [fmt]})
        assert code == 200, body
        out[fmt] = body
    return out, api
