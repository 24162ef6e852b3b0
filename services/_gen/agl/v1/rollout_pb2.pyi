import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RolloutState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLLOUT_STATE_UNSPECIFIED: _ClassVar[RolloutState]
    ROLLOUT_STATE_QUEUING: _ClassVar[RolloutState]
    ROLLOUT_STATE_RUNNING: _ClassVar[RolloutState]
    ROLLOUT_STATE_SUCCEEDED: _ClassVar[RolloutState]
    ROLLOUT_STATE_FAILED: _ClassVar[RolloutState]

class FailureReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILURE_REASON_UNSPECIFIED: _ClassVar[FailureReason]
    FAILURE_REASON_EXIT_CODE: _ClassVar[FailureReason]
    FAILURE_REASON_KILLED: _ClassVar[FailureReason]
    FAILURE_REASON_TIMEOUT: _ClassVar[FailureReason]
    FAILURE_REASON_LAUNCH_ERROR: _ClassVar[FailureReason]
    FAILURE_REASON_LOST: _ClassVar[FailureReason]
    FAILURE_REASON_LAUNCHER_DIED: _ClassVar[FailureReason]
    FAILURE_REASON_JOB_FAILED: _ClassVar[FailureReason]
    FAILURE_REASON_CONTROLLER_SHUTDOWN: _ClassVar[FailureReason]
    FAILURE_REASON_INVALID_CONFIG: _ClassVar[FailureReason]
    FAILURE_REASON_INTERNAL: _ClassVar[FailureReason]
ROLLOUT_STATE_UNSPECIFIED: RolloutState
ROLLOUT_STATE_QUEUING: RolloutState
ROLLOUT_STATE_RUNNING: RolloutState
ROLLOUT_STATE_SUCCEEDED: RolloutState
ROLLOUT_STATE_FAILED: RolloutState
FAILURE_REASON_UNSPECIFIED: FailureReason
FAILURE_REASON_EXIT_CODE: FailureReason
FAILURE_REASON_KILLED: FailureReason
FAILURE_REASON_TIMEOUT: FailureReason
FAILURE_REASON_LAUNCH_ERROR: FailureReason
FAILURE_REASON_LOST: FailureReason
FAILURE_REASON_LAUNCHER_DIED: FailureReason
FAILURE_REASON_JOB_FAILED: FailureReason
FAILURE_REASON_CONTROLLER_SHUTDOWN: FailureReason
FAILURE_REASON_INVALID_CONFIG: FailureReason
FAILURE_REASON_INTERNAL: FailureReason

class LocalLaunchConfig(_message.Message):
    __slots__ = ("agent_class", "command", "env_map")
    class EnvMapEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_CLASS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_MAP_FIELD_NUMBER: _ClassVar[int]
    agent_class: str
    command: _containers.RepeatedScalarFieldContainer[str]
    env_map: _containers.ScalarMap[str, str]
    def __init__(self, agent_class: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., env_map: _Optional[_Mapping[str, str]] = ...) -> None: ...

class K8sLaunchConfig(_message.Message):
    __slots__ = ("job_template",)
    JOB_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    job_template: str
    def __init__(self, job_template: _Optional[str] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("max_attempts", "retry_on", "initial_backoff_seconds", "max_backoff_seconds", "backoff_multiplier")
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RETRY_ON_FIELD_NUMBER: _ClassVar[int]
    INITIAL_BACKOFF_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_BACKOFF_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    max_attempts: int
    retry_on: _containers.RepeatedScalarFieldContainer[FailureReason]
    initial_backoff_seconds: float
    max_backoff_seconds: float
    backoff_multiplier: float
    def __init__(self, max_attempts: _Optional[int] = ..., retry_on: _Optional[_Iterable[_Union[FailureReason, str]]] = ..., initial_backoff_seconds: _Optional[float] = ..., max_backoff_seconds: _Optional[float] = ..., backoff_multiplier: _Optional[float] = ...) -> None: ...

class RolloutConfig(_message.Message):
    __slots__ = ("timeout_seconds", "local", "k8s", "retry")
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    K8S_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    timeout_seconds: float
    local: LocalLaunchConfig
    k8s: K8sLaunchConfig
    retry: RetryPolicy
    def __init__(self, timeout_seconds: _Optional[float] = ..., local: _Optional[_Union[LocalLaunchConfig, _Mapping]] = ..., k8s: _Optional[_Union[K8sLaunchConfig, _Mapping]] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("attempt_id", "number", "state", "failure_reason", "error_message", "launcher_ref", "start_time", "end_time")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAUNCHER_REF_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    number: int
    state: RolloutState
    failure_reason: FailureReason
    error_message: str
    launcher_ref: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    def __init__(self, attempt_id: _Optional[str] = ..., number: _Optional[int] = ..., state: _Optional[_Union[RolloutState, str]] = ..., failure_reason: _Optional[_Union[FailureReason, str]] = ..., error_message: _Optional[str] = ..., launcher_ref: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RolloutMetadata(_message.Message):
    __slots__ = ("labels", "data_json")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABELS_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.ScalarMap[str, str]
    data_json: str
    def __init__(self, labels: _Optional[_Mapping[str, str]] = ..., data_json: _Optional[str] = ...) -> None: ...

class RolloutStatus(_message.Message):
    __slots__ = ("state", "error_message", "attempt_id", "launcher_ref", "controller_id", "version", "create_time", "update_time", "start_time", "end_time", "revision", "attempts", "retry_time", "failure_reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    LAUNCHER_REF_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RETRY_TIME_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    state: RolloutState
    error_message: str
    attempt_id: str
    launcher_ref: str
    controller_id: str
    version: int
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    revision: int
    attempts: _containers.RepeatedCompositeFieldContainer[Attempt]
    retry_time: _timestamp_pb2.Timestamp
    failure_reason: FailureReason
    def __init__(self, state: _Optional[_Union[RolloutState, str]] = ..., error_message: _Optional[str] = ..., attempt_id: _Optional[str] = ..., launcher_ref: _Optional[str] = ..., controller_id: _Optional[str] = ..., version: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revision: _Optional[int] = ..., attempts: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., retry_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., failure_reason: _Optional[_Union[FailureReason, str]] = ...) -> None: ...

class Rollout(_message.Message):
    __slots__ = ("rollout_id", "input_json", "is_train", "config", "metadata", "status")
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    IS_TRAIN_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    rollout_id: str
    input_json: str
    is_train: bool
    config: RolloutConfig
    metadata: RolloutMetadata
    status: RolloutStatus
    def __init__(self, rollout_id: _Optional[str] = ..., input_json: _Optional[str] = ..., is_train: _Optional[bool] = ..., config: _Optional[_Union[RolloutConfig, _Mapping]] = ..., metadata: _Optional[_Union[RolloutMetadata, _Mapping]] = ..., status: _Optional[_Union[RolloutStatus, _Mapping]] = ...) -> None: ...

class RolloutSpec(_message.Message):
    __slots__ = ("rollout_id", "input_json", "is_train", "config", "metadata")
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    IS_TRAIN_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    rollout_id: str
    input_json: str
    is_train: bool
    config: RolloutConfig
    metadata: RolloutMetadata
    def __init__(self, rollout_id: _Optional[str] = ..., input_json: _Optional[str] = ..., is_train: _Optional[bool] = ..., config: _Optional[_Union[RolloutConfig, _Mapping]] = ..., metadata: _Optional[_Union[RolloutMetadata, _Mapping]] = ...) -> None: ...
