"""The interner (collector/intern.py): ids of content, the same in every
store, and the rows it makes of a profile."""

from __future__ import annotations

import pickle

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.collector.ids import content_id, frame_id, mapping_fields
from ember.collector.intern import _ODD, Interner, Rows, _repeats
from ember.encode.pprof import FunctionKey, MappingKey
from ember.model import Frame, FrameKind, Mapping


def test_repeated_pairs_are_found_even_when_their_folded_words_meet() -> None:
    """``_repeats`` folds (thread, stack) into one word: words that meet
    send the pairs to be compared, so only equal pairs answer yes."""
    rng = np.random.default_rng(4)
    thread = rng.integers(0, 1 << 63, 50, dtype=np.uint64)
    stack = rng.integers(0, 1 << 63, 50, dtype=np.uint64)
    assert not _repeats(thread, stack)
    # pair 1 made to fold to pair 0's word, with another thread and stack
    times = thread * _ODD   # (arrays: they wrap without a warning)
    stack[1] = times[0] ^ stack[0] ^ times[1]
    words = thread * _ODD ^ stack
    assert words[0] == words[1] and (thread[0], stack[0]) != (thread[1], stack[1])
    assert not _repeats(thread, stack)
    thread[2], stack[2] = thread[0], stack[0]
    assert _repeats(thread, stack)
    assert not _repeats(thread[:0], stack[:0]) and not _repeats(thread[:1], stack[:1])


NAMES = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
MAPPINGS = st.one_of(st.none(), st.builds(
    Mapping, st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1),
    st.integers(0, (1 << 64) - 1), NAMES, NAMES, st.booleans()))


@settings(max_examples=2_000, deadline=None, derandomize=True)
@given(st.builds(Frame, NAMES, st.sampled_from(FrameKind), MAPPINGS,
                 st.integers(0, (1 << 64) - 1), NAMES, NAMES, st.integers(-(1 << 63), 1 << 63),
                 st.booleans()))
def test_a_frames_id_is_the_content_id_of_its_fields(frame: Frame) -> None:
    """frame_id writes the JSON itself: it must be the id every store
    already holds for the frame (any strings: quotes, controls, lone
    surrogates, astral planes)."""
    assert frame_id(frame) == content_id(
        "frame", frame.name, str(frame.kind), mapping_fields(frame.mapping), frame.address,
        frame.system_name, frame.file, frame.line, frame.inlined)
    # (and a frame crosses to the collector from a decode worker unchanged)
    again = pickle.loads(pickle.dumps(frame))
    assert again == frame and hash(again) == hash(frame) and type(again.kind) is FrameKind


MAPPING_KEYS = st.one_of(st.none(), st.just((0xFFFF800000000000, 0xFFFFFFFFFFFFFFFF, 0,
                                              "[kernel.kallsyms]", "", True)),
                        st.tuples(st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1),
                                  st.integers(0, (1 << 64) - 1), NAMES, NAMES, st.booleans()))


@settings(max_examples=2_000, deadline=None, derandomize=True)
@given(st.integers(0, (1 << 64) - 1), MAPPING_KEYS, st.integers(-(1 << 63), (1 << 63) - 1),
       st.one_of(st.none(), st.tuples(NAMES, st.one_of(NAMES, st.just("same")), NAMES)))
def test_a_location_of_one_line_makes_the_frame_and_id_the_general_path_makes(
        address: int, mapping: MappingKey | None, line: int, fn: FunctionKey | None) -> None:
    """``_made_one`` writes the frame and its id at once: they must be what
    ``location_frames`` and ``frame_id`` make (no function, a name that is
    empty, a system name equal to it, a kernel, user or no mapping)."""
    if fn is not None and fn[1] == "same":
        fn = (fn[0], fn[0], fn[2])
    fast, general = Rows(), Rows()
    lines = ((line, fn),)
    ids = Interner()._made_one(address, mapping, lines, fast)
    assert ids == Interner()._made(address, mapping, lines, general)
    assert fast.new_frames == general.new_frames and len(fast.new_frames) == 1


def one_row(stack: int, new_stacks: dict[int, tuple[int, ...]],
            new_frames: dict[int, Frame]) -> Rows:
    rows = Rows(new_stacks=new_stacks, new_frames=new_frames)
    for col in (rows.time_ns, rows.end_ns, rows.series, rows.type, rows.thread, rows.tname):
        col.append(1)
    rows.stack.append(stack)
    for vs in rows.values:
        vs.append(1)
    return rows


def test_rows_naming_a_frame_neither_stored_nor_sent_are_not_adopted() -> None:
    """A worker's stack is adopted only if each of its frames is stored,
    sent along, or already among the rows being written."""
    it = Interner()
    f = {i: Frame(f"f{i}", FrameKind.USER) for i in range(4)}
    it.frames.update({0: f[0]})
    it.stacks.update([100])
    assert it.adopt(Rows(), one_row(100, {}, {}))                     # stored stack
    assert not it.adopt(Rows(), one_row(101, {}, {}))                 # stack not sent
    assert it.adopt(Rows(), one_row(101, {101: (0, 1)}, {1: f[1]}))   # frame 1 sent along
    assert not it.adopt(Rows(), one_row(101, {101: (0, 1, 2)}, {1: f[1]}))   # 2 is not
    pending = Rows(new_frames={2: f[2]})
    assert it.adopt(pending, one_row(101, {101: (0, 1, 2)}, {1: f[1]}))   # 2 in the write
    assert set(pending.new_frames) == {1, 2} and set(pending.new_stacks) == {101}
    it.stacks.update([102])   # a stored stack sent again: its frames are not asked for
    assert it.adopt(Rows(), one_row(102, {102: (3,)}, {}))
