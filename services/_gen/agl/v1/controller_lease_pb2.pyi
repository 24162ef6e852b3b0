import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ControllerLease(_message.Message):
    __slots__ = ("controller_id", "ttl_seconds", "renew_time", "expire_time", "running_rollouts")
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RENEW_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    RUNNING_ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    controller_id: str
    ttl_seconds: float
    renew_time: _timestamp_pb2.Timestamp
    expire_time: _timestamp_pb2.Timestamp
    running_rollouts: int
    def __init__(self, controller_id: _Optional[str] = ..., ttl_seconds: _Optional[float] = ..., renew_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., running_rollouts: _Optional[int] = ...) -> None: ...
