"""Content ids: the id of a frame, stack, thread, series or type is the
first 8 bytes of BLAKE2b over a canonical encoding of its content, never a
counter, so the same thing has the same id in every store and partial sums
from several stores add up (intern.py interns rows under them)."""

from __future__ import annotations

import functools
import hashlib
import json
from array import array
from collections.abc import Iterable, Sequence

from ..encode.folded import clean
from ..model import Frame, Mapping
from .stackids import stack_digest

#: Thread labels: (pid, tid, thread name, other sample labels sorted).
ThreadKey = tuple[int, int, str, tuple[tuple[str, str], ...]]


#: Content as the JSON its ids are taken of (what ``json.dumps`` with these
#: settings writes).
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def content_id(*parts: object) -> int:
    """A 64-bit id of JSON-encodable content, the same in every store."""
    return text_id(_JSON.encode(parts))


def text_id(text: str) -> int:
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def stack_id(frame_ids: Sequence[int]) -> int:
    """The id of a stack: its frame ids, root first."""
    return stack_digest(array("Q", frame_ids).tobytes())


def mapping_fields(m: Mapping | None) -> tuple[object, ...] | None:
    if m is None:
        return None
    return (m.start, m.limit, m.offset, m.path, m.build_id, m.has_functions)


def frame_id(f: Frame) -> int:
    """``content_id("frame", name, kind, mapping fields, address, system
    name, file, line, inlined)``, its JSON written here: the strings through
    the encoder ``json.dumps`` uses, the mapping's JSON kept. A profile's
    first read makes a frame for each of its 5,000 locations, and
    ``json.dumps`` took a third of that."""
    return text_id(frame_text(f.name, frame_head(f.kind, f.mapping), int(f.address),
                              f.system_name, f.file, int(f.line), f.inlined))


def frame_head(kind: object, mapping: Mapping | None) -> str:
    """What a frame's kind and mapping write in its id's text (the same for
    every frame of a mapping: intern.py keeps it per mapping)."""
    return f"{json_string(str(kind))},{mapping_json(mapping)}"


def frame_text(name: str, head: str, address: int, system: str, file: str, line: int,
               inlined: bool) -> str:
    """The text a frame's id is taken of, ``head`` from ``frame_head``."""
    return (f'["frame",{json_string(name)},{head},{address},{json_string(system)},'
            f'{json_string(file)},{line},{"true" if inlined else "false"}]')


#: A str as JSON, as ``json.dumps(..., ensure_ascii=False)`` writes it.
json_string = json.encoder.encode_basestring


@functools.lru_cache(maxsize=4096)
def mapping_json(m: Mapping | None) -> str:
    return _JSON.encode(mapping_fields(m))


def series_id(labels_json: str) -> int:
    return content_id("series", labels_json)


def thread_id(key: ThreadKey) -> int:
    return content_id("thread", key[0], key[1], key[2], key[3])


def thread_name_id(name: str) -> int:
    """The id of a thread name as the flame graph's first level shows it."""
    return content_id("thread-name", clean(name))


def type_id(type_: str) -> int:
    return content_id("type", type_)


def labels_json(labels: Iterable[tuple[str, str]]) -> str:
    return json.dumps(sorted(labels), separators=(",", ":"))
