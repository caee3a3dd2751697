"""Running the real recorder in-process and reading its profiles."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable

from ember.model import Profile, Sample
from ember.record import Recorder, RecordOptions


def record(options: RecordOptions) -> tuple[Profile, Recorder]:
    recorder = Recorder(options)
    profile = recorder.run(threading.Event())
    return profile, recorder


def inclusive(samples: Iterable[Sample], names: Iterable[str], index: int) -> dict[str, float]:
    """Each name's inclusive share of the samples' value at index."""
    names = list(names)
    total = 0
    acc: Counter[str] = Counter()
    for s in samples:
        v = s.values[index]
        total += v
        present = {f.name for f in s.frames}
        for n in names:
            if n in present:
                acc[n] += v
    assert total > 0, "no samples"
    return {n: 100.0 * acc[n] / total for n in names}


def where(profile: Profile, pred: Callable[[Sample], bool]) -> list[Sample]:
    return [s for s in profile.samples if pred(s)]
