from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WriteRawRequest(_message.Message):
    __slots__ = ("tenant", "series", "normalized")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    series: _containers.RepeatedCompositeFieldContainer[RawProfileSeries]
    normalized: bool
    def __init__(self, tenant: _Optional[str] = ..., series: _Optional[_Iterable[_Union[RawProfileSeries, _Mapping]]] = ..., normalized: _Optional[bool] = ...) -> None: ...

class WriteRawResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RawProfileSeries(_message.Message):
    __slots__ = ("labels", "samples")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    labels: LabelSet
    samples: _containers.RepeatedCompositeFieldContainer[RawSample]
    def __init__(self, labels: _Optional[_Union[LabelSet, _Mapping]] = ..., samples: _Optional[_Iterable[_Union[RawSample, _Mapping]]] = ...) -> None: ...

class Label(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class LabelSet(_message.Message):
    __slots__ = ("labels",)
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[Label]
    def __init__(self, labels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ...) -> None: ...

class RawSample(_message.Message):
    __slots__ = ("raw_profile", "executable_info")
    RAW_PROFILE_FIELD_NUMBER: _ClassVar[int]
    EXECUTABLE_INFO_FIELD_NUMBER: _ClassVar[int]
    raw_profile: bytes
    executable_info: _containers.RepeatedCompositeFieldContainer[ExecutableInfo]
    def __init__(self, raw_profile: _Optional[bytes] = ..., executable_info: _Optional[_Iterable[_Union[ExecutableInfo, _Mapping]]] = ...) -> None: ...

class ExecutableInfo(_message.Message):
    __slots__ = ("elf_type", "load_segment")
    ELF_TYPE_FIELD_NUMBER: _ClassVar[int]
    LOAD_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    elf_type: int
    load_segment: LoadSegment
    def __init__(self, elf_type: _Optional[int] = ..., load_segment: _Optional[_Union[LoadSegment, _Mapping]] = ...) -> None: ...

class LoadSegment(_message.Message):
    __slots__ = ("offset", "vaddr")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    VADDR_FIELD_NUMBER: _ClassVar[int]
    offset: int
    vaddr: int
    def __init__(self, offset: _Optional[int] = ..., vaddr: _Optional[int] = ...) -> None: ...
