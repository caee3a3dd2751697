"""A query's result read through the Arrow C stream interface, in C (_arrow.c)."""

class Unread(ValueError): ...

class Column:
    """One column of a batch, as a read-only buffer of its bytes."""
    def __buffer__(self, flags: int, /) -> memoryview: ...

def read(stream: object, most: int, /
         ) -> tuple[list[str], list[str], list[tuple[Column, ...]]] | None: ...
