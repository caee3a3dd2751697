from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PushResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("series",)
    SERIES_FIELD_NUMBER: _ClassVar[int]
    series: _containers.RepeatedCompositeFieldContainer[RawProfileSeries]
    def __init__(self, series: _Optional[_Iterable[_Union[RawProfileSeries, _Mapping]]] = ...) -> None: ...

class RawProfileSeries(_message.Message):
    __slots__ = ("labels", "samples")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[LabelPair]
    samples: _containers.RepeatedCompositeFieldContainer[RawSample]
    def __init__(self, labels: _Optional[_Iterable[_Union[LabelPair, _Mapping]]] = ..., samples: _Optional[_Iterable[_Union[RawSample, _Mapping]]] = ...) -> None: ...

class LabelPair(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class RawSample(_message.Message):
    __slots__ = ("raw_profile", "ID")
    RAW_PROFILE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    raw_profile: bytes
    ID: str
    def __init__(self, raw_profile: _Optional[bytes] = ..., ID: _Optional[str] = ...) -> None: ...
