from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ProfileStrings(_message.Message):
    __slots__ = ("string_table",)
    STRING_TABLE_FIELD_NUMBER: _ClassVar[int]
    string_table: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, string_table: _Optional[_Iterable[bytes]] = ...) -> None: ...
