import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProxyReplica(_message.Message):
    __slots__ = ("replica_id", "in_flight", "observed_generation", "report_time", "ttl_seconds", "model_in_flight")
    class ModelInFlightEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REPORT_TIME_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    in_flight: int
    observed_generation: int
    report_time: _timestamp_pb2.Timestamp
    ttl_seconds: float
    model_in_flight: _containers.ScalarMap[str, int]
    def __init__(self, replica_id: _Optional[str] = ..., in_flight: _Optional[int] = ..., observed_generation: _Optional[int] = ..., report_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ttl_seconds: _Optional[float] = ..., model_in_flight: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ModelPause(_message.Message):
    __slots__ = ("model_name", "retry_after_seconds", "reason", "owner", "lease_expire_time", "update_time")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    retry_after_seconds: int
    reason: str
    owner: str
    lease_expire_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, model_name: _Optional[str] = ..., retry_after_seconds: _Optional[int] = ..., reason: _Optional[str] = ..., owner: _Optional[str] = ..., lease_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ProxyControl(_message.Message):
    __slots__ = ("paused", "retry_after_seconds", "reason", "generation", "update_time", "replicas", "owner", "lease_expire_time", "model_pauses")
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    MODEL_PAUSES_FIELD_NUMBER: _ClassVar[int]
    paused: bool
    retry_after_seconds: int
    reason: str
    generation: int
    update_time: _timestamp_pb2.Timestamp
    replicas: _containers.RepeatedCompositeFieldContainer[ProxyReplica]
    owner: str
    lease_expire_time: _timestamp_pb2.Timestamp
    model_pauses: _containers.RepeatedCompositeFieldContainer[ModelPause]
    def __init__(self, paused: _Optional[bool] = ..., retry_after_seconds: _Optional[int] = ..., reason: _Optional[str] = ..., generation: _Optional[int] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., replicas: _Optional[_Iterable[_Union[ProxyReplica, _Mapping]]] = ..., owner: _Optional[str] = ..., lease_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., model_pauses: _Optional[_Iterable[_Union[ModelPause, _Mapping]]] = ...) -> None: ...
