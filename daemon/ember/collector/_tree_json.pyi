"""A pruned flame graph's text, in C (_tree_json.c)."""

from typing_extensions import Buffer

def text(pre: Buffer, closes: Buffer, nids: Buffer, names: list[str | None], value: Buffer,
         own: Buffer, first: str | None, /) -> str: ...
