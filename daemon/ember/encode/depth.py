"""The depth cap of ``model.cap_depth`` for model stacks, as every encoder
applies it: a deeper stack keeps its leafmost frames under a root
``[truncated]`` marker, so the output stays bounded and a reader that walks
it frame by frame never meets a runaway recursion."""

from __future__ import annotations

from collections.abc import Sequence

from ..model import MAX_STACK_DEPTH, TRUNCATED, Frame, cap_depth


def cap_frames(frames: Sequence[Frame], limit: int = MAX_STACK_DEPTH) -> Sequence[Frame]:
    """The stack (root first) capped at ``limit`` frames. The marker takes
    the kind of the frame it stands above, as the stack walkers' own
    truncation markers do, so a user/kernel split stays where it was."""
    if len(frames) <= limit:
        return frames
    return cap_depth(frames, Frame.marker(TRUNCATED, frames[len(frames) - limit + 1].kind), limit)
