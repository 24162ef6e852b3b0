import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelEndpoint(_message.Message):
    __slots__ = ("model_name", "endpoint", "version", "update_time", "weight_label")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_LABEL_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    endpoint: str
    version: int
    update_time: _timestamp_pb2.Timestamp
    weight_label: str
    def __init__(self, model_name: _Optional[str] = ..., endpoint: _Optional[str] = ..., version: _Optional[int] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., weight_label: _Optional[str] = ...) -> None: ...

class ModelEndpointKey(_message.Message):
    __slots__ = ("model_name", "endpoint")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    endpoint: str
    def __init__(self, model_name: _Optional[str] = ..., endpoint: _Optional[str] = ...) -> None: ...
