"""Folded stacks, as Brendan Gregg's FlameGraph tools read them.

One line per distinct stack: ``thread;root;...;leaf COUNT``, COUNT in samples
for on-CPU and in microseconds for off-CPU (the profile type says which value
and scale). With ``delimiter``, a ``-`` frame separates the user part from the
kernel part (bcc offcputime's ``-d``).
"""

from __future__ import annotations

from collections import Counter

from ..model import FrameKind, Profile


def clean(name: str) -> str:
    """Frame names may not contain the separators of the format."""
    return name.replace(";", ":").replace("\n", " ").replace("\r", " ")


def fold(profile: Profile, delimiter: bool = False, thread_name: bool = True) -> Counter[str]:
    """Stacks -> summed count in the folded unit (lines merge across threads)."""
    t = profile.type
    out: Counter[str] = Counter()
    for s in profile.samples:
        parts = [clean(s.thread_name)] if thread_name else []
        names = [clean(f.name) for f in s.frames]
        if delimiter:
            n_user = sum(1 for f in s.frames if f.kind == FrameKind.USER)
            names.insert(n_user, "-")
        parts += names
        out[";".join(parts)] += s.values[t.folded_index]
    if t.folded_scale != 1:
        out = Counter({k: v // t.folded_scale for k, v in out.items()})
    return out


def encode_folded(profile: Profile, delimiter: bool = False) -> str:
    folded = fold(profile, delimiter)
    return "".join(f"{stack} {count}\n" for stack, count in sorted(folded.items()) if count > 0)


def parse_folded(text: str) -> Counter[str]:
    """Read folded lines back (the count is after the last space)."""
    out: Counter[str] = Counter()
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        stack, sep, count = line.rpartition(" ")
        if not sep or not count.isdigit():
            raise ValueError(f"line {lineno}: expected 'stack count', got {line[:80]!r}")
        out[stack] += int(count)
    return out
