from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ProfileTables(_message.Message):
    __slots__ = ("sample", "location", "function")
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    sample: _containers.RepeatedScalarFieldContainer[bytes]
    location: _containers.RepeatedScalarFieldContainer[bytes]
    function: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, sample: _Optional[_Iterable[bytes]] = ..., location: _Optional[_Iterable[bytes]] = ..., function: _Optional[_Iterable[bytes]] = ...) -> None: ...
