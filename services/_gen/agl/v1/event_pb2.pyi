import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_VIEW_UNSPECIFIED: _ClassVar[EventView]
    EVENT_VIEW_FULL: _ClassVar[EventView]
    EVENT_VIEW_TRIPLET: _ClassVar[EventView]

class ModelRequestStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_REQUEST_STATUS_UNSPECIFIED: _ClassVar[ModelRequestStatus]
    MODEL_REQUEST_STATUS_OK: _ClassVar[ModelRequestStatus]
    MODEL_REQUEST_STATUS_ERROR: _ClassVar[ModelRequestStatus]
    MODEL_REQUEST_STATUS_INCOMPLETE: _ClassVar[ModelRequestStatus]

class ModelRequestRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_REQUEST_ROLE_UNSPECIFIED: _ClassVar[ModelRequestRole]
    MODEL_REQUEST_ROLE_POLICY: _ClassVar[ModelRequestRole]
    MODEL_REQUEST_ROLE_OTHER_POLICY: _ClassVar[ModelRequestRole]
    MODEL_REQUEST_ROLE_FROZEN: _ClassVar[ModelRequestRole]
EVENT_VIEW_UNSPECIFIED: EventView
EVENT_VIEW_FULL: EventView
EVENT_VIEW_TRIPLET: EventView
MODEL_REQUEST_STATUS_UNSPECIFIED: ModelRequestStatus
MODEL_REQUEST_STATUS_OK: ModelRequestStatus
MODEL_REQUEST_STATUS_ERROR: ModelRequestStatus
MODEL_REQUEST_STATUS_INCOMPLETE: ModelRequestStatus
MODEL_REQUEST_ROLE_UNSPECIFIED: ModelRequestRole
MODEL_REQUEST_ROLE_POLICY: ModelRequestRole
MODEL_REQUEST_ROLE_OTHER_POLICY: ModelRequestRole
MODEL_REQUEST_ROLE_FROZEN: ModelRequestRole

class TokenUsage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "total_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ...) -> None: ...

class ModelRequest(_message.Message):
    __slots__ = ("request_json", "response_json", "prompt_token_ids", "response_token_ids", "response_logprobs", "has_response_logprobs", "model", "model_version", "endpoint", "latency_seconds", "http_status", "retry_count", "usage", "finish_reason", "status", "api", "stream", "tool_calls", "warnings", "requested_max_tokens", "granted_max_tokens", "requested_model", "role")
    REQUEST_JSON_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_JSON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    HAS_RESPONSE_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LATENCY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    API_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GRANTED_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_MODEL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    request_json: str
    response_json: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_logprobs: _containers.RepeatedScalarFieldContainer[float]
    has_response_logprobs: bool
    model: str
    model_version: int
    endpoint: str
    latency_seconds: float
    http_status: int
    retry_count: int
    usage: TokenUsage
    finish_reason: str
    status: ModelRequestStatus
    api: str
    stream: bool
    tool_calls: ToolCallStats
    warnings: _containers.RepeatedScalarFieldContainer[str]
    requested_max_tokens: int
    granted_max_tokens: int
    requested_model: str
    role: ModelRequestRole
    def __init__(self, request_json: _Optional[str] = ..., response_json: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., response_token_ids: _Optional[_Iterable[int]] = ..., response_logprobs: _Optional[_Iterable[float]] = ..., has_response_logprobs: _Optional[bool] = ..., model: _Optional[str] = ..., model_version: _Optional[int] = ..., endpoint: _Optional[str] = ..., latency_seconds: _Optional[float] = ..., http_status: _Optional[int] = ..., retry_count: _Optional[int] = ..., usage: _Optional[_Union[TokenUsage, _Mapping]] = ..., finish_reason: _Optional[str] = ..., status: _Optional[_Union[ModelRequestStatus, str]] = ..., api: _Optional[str] = ..., stream: _Optional[bool] = ..., tool_calls: _Optional[_Union[ToolCallStats, _Mapping]] = ..., warnings: _Optional[_Iterable[str]] = ..., requested_max_tokens: _Optional[int] = ..., granted_max_tokens: _Optional[int] = ..., requested_model: _Optional[str] = ..., role: _Optional[_Union[ModelRequestRole, str]] = ...) -> None: ...

class ToolCallStats(_message.Message):
    __slots__ = ("offered_tools", "parsed_calls", "unparsed_calls", "unknown_tool_calls", "invalid_argument_calls")
    OFFERED_TOOLS_FIELD_NUMBER: _ClassVar[int]
    PARSED_CALLS_FIELD_NUMBER: _ClassVar[int]
    UNPARSED_CALLS_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    INVALID_ARGUMENT_CALLS_FIELD_NUMBER: _ClassVar[int]
    offered_tools: int
    parsed_calls: int
    unparsed_calls: int
    unknown_tool_calls: int
    invalid_argument_calls: int
    def __init__(self, offered_tools: _Optional[int] = ..., parsed_calls: _Optional[int] = ..., unparsed_calls: _Optional[int] = ..., unknown_tool_calls: _Optional[int] = ..., invalid_argument_calls: _Optional[int] = ...) -> None: ...

class Reward(_message.Message):
    __slots__ = ("value", "message", "source", "reason", "data_json")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    value: float
    message: str
    source: str
    reason: str
    data_json: str
    def __init__(self, value: _Optional[float] = ..., message: _Optional[str] = ..., source: _Optional[str] = ..., reason: _Optional[str] = ..., data_json: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("rollout_id", "attempt_id", "sequence", "event_type", "create_time", "event_id", "model_request", "reward", "data_json")
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_REQUEST_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    rollout_id: str
    attempt_id: str
    sequence: int
    event_type: str
    create_time: _timestamp_pb2.Timestamp
    event_id: str
    model_request: ModelRequest
    reward: Reward
    data_json: str
    def __init__(self, rollout_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., sequence: _Optional[int] = ..., event_type: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., event_id: _Optional[str] = ..., model_request: _Optional[_Union[ModelRequest, _Mapping]] = ..., reward: _Optional[_Union[Reward, _Mapping]] = ..., data_json: _Optional[str] = ...) -> None: ...
