"""Folded stacks, as Brendan Gregg's FlameGraph tools read them.

One line per distinct stack: ``thread;root;...;leaf COUNT``, COUNT in samples
for on-CPU and in microseconds for off-CPU (the profile type says which value
and scale). With ``delimiter``, a ``-`` frame separates the user part from the
kernel part (bcc offcputime's ``-d``).

Written stacks are capped at ``MAX_STACK_DEPTH`` frames (thread name
included), and so are the stacks read back: the leafmost frames stay, under
a root ``[truncated]`` frame.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ..model import MAX_STACK_DEPTH, TRUNCATED, FrameKind, Profile, cap_depth
from .depth import cap_frames

#: The most digits a count may have: any int64 fits, and Python refuses to
#: read integers of thousands of digits anyway.
MAX_COUNT_DIGITS = 19
#: The longest line read: 2048 frames of 8 KiB names, far more than any
#: real stack, so one line can never take a file's worth of memory.
MAX_LINE = 16 << 20


class FoldedError(ValueError):
    """A line that is not ``stack count``: its number and what is wrong, so
    the caller can say ``FILE:LINE: problem``."""

    def __init__(self, lineno: int, problem: str) -> None:
        super().__init__(f"line {lineno}: {problem}")
        self.lineno = lineno
        self.problem = problem


def clean(name: str) -> str:
    """Frame names may not contain the separators of the format."""
    return name.replace(";", ":").replace("\n", " ").replace("\r", " ")


def cap_folded(stack: str, limit: int = MAX_STACK_DEPTH) -> str:
    """A folded stack of at most ``limit`` frames (``model.cap_depth``)."""
    if len(stack) < limit or stack.count(";") < limit:  # the length check is the cheap one
        return stack
    return ";".join(cap_depth(stack.split(";"), TRUNCATED, limit))


def fold(profile: Profile, delimiter: bool = False, thread_name: bool = True) -> Counter[str]:
    """Stacks -> summed count in the folded unit (lines merge across threads)."""
    t = profile.type
    out: Counter[str] = Counter()
    limit = MAX_STACK_DEPTH - (1 if thread_name else 0) - (1 if delimiter else 0)
    for s in profile.samples:
        parts = [clean(s.thread_name)] if thread_name else []
        frames = cap_frames(s.frames, limit)
        names = [clean(f.name) for f in frames]
        if delimiter:
            n_user = sum(1 for f in frames if f.kind == FrameKind.USER)
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
    _add_lines(text.split("\n"), out, 0)
    return out


def read_folded(chunks: Iterable[bytes]) -> Counter[str]:
    """Folded stacks from a byte stream in chunks, summed as they come, so
    memory grows with the distinct stacks, not with the input. Bytes that
    are not UTF-8 become U+FFFD: a stray byte in one name must not cost
    the whole profile. FoldedError names the first malformed line."""
    out: Counter[str] = Counter()
    lineno = 0
    pending: list[bytes] = []  # the start of a line that has not ended yet
    pending_size = 0
    for chunk in chunks:
        end = chunk.rfind(b"\n")
        if end < 0:
            pending.append(chunk)
            pending_size += len(chunk)
            if pending_size > MAX_LINE:
                raise FoldedError(lineno + 1, f"longer than {MAX_LINE} bytes")
            continue
        pending.append(chunk[:end])
        block = b"".join(pending).decode("utf-8", "replace")
        lineno = _add_lines(block.split("\n"), out, lineno)
        pending, pending_size = [chunk[end + 1:]], len(chunk) - end - 1
    _add_lines(b"".join(pending).decode("utf-8", "replace").split("\n"), out, lineno)
    return out


def _add_lines(lines: list[str], out: Counter[str], lineno: int) -> int:
    """Add the stacks of these lines (numbered from ``lineno + 1``) to out;
    the number of the last one. Each distinct line is parsed once: folded
    files repeat lines, and counting them first is done in C."""
    for line, times in Counter(lines).items():
        text = line.strip()
        if not text:
            continue
        stack, sep, count = text.rpartition(" ")
        if not sep or not count.isdigit() or not count.isascii():
            problem = f"expected 'stack count', got {text[:80]!r}"
        elif len(count) > MAX_COUNT_DIGITS:
            problem = f"count {count[:MAX_COUNT_DIGITS]}... out of range"
        else:
            out[cap_folded(stack)] += int(count) * times
            continue
        # dicts keep insertion order: this is the first malformed line
        raise FoldedError(lineno + lines.index(line) + 1, problem)
    return lineno + len(lines)
