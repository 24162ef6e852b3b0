from . import controller_lease_pb2 as _controller_lease_pb2
from . import event_pb2 as _event_pb2
from . import model_pb2 as _model_pb2
from . import proxy_control_pb2 as _proxy_control_pb2
from . import rollout_pb2 as _rollout_pb2
from . import run_pb2 as _run_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RolloutChangeType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLLOUT_CHANGE_TYPE_UNSPECIFIED: _ClassVar[RolloutChangeType]
    ROLLOUT_CHANGE_TYPE_SNAPSHOT: _ClassVar[RolloutChangeType]
    ROLLOUT_CHANGE_TYPE_SYNCED: _ClassVar[RolloutChangeType]
    ROLLOUT_CHANGE_TYPE_UPSERT: _ClassVar[RolloutChangeType]
    ROLLOUT_CHANGE_TYPE_DELETE: _ClassVar[RolloutChangeType]

class RunChangeType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_CHANGE_TYPE_UNSPECIFIED: _ClassVar[RunChangeType]
    RUN_CHANGE_TYPE_SNAPSHOT: _ClassVar[RunChangeType]
    RUN_CHANGE_TYPE_SYNCED: _ClassVar[RunChangeType]
    RUN_CHANGE_TYPE_RUN: _ClassVar[RunChangeType]
    RUN_CHANGE_TYPE_STEP: _ClassVar[RunChangeType]
    RUN_CHANGE_TYPE_DELETE: _ClassVar[RunChangeType]
ROLLOUT_CHANGE_TYPE_UNSPECIFIED: RolloutChangeType
ROLLOUT_CHANGE_TYPE_SNAPSHOT: RolloutChangeType
ROLLOUT_CHANGE_TYPE_SYNCED: RolloutChangeType
ROLLOUT_CHANGE_TYPE_UPSERT: RolloutChangeType
ROLLOUT_CHANGE_TYPE_DELETE: RolloutChangeType
RUN_CHANGE_TYPE_UNSPECIFIED: RunChangeType
RUN_CHANGE_TYPE_SNAPSHOT: RunChangeType
RUN_CHANGE_TYPE_SYNCED: RunChangeType
RUN_CHANGE_TYPE_RUN: RunChangeType
RUN_CHANGE_TYPE_STEP: RunChangeType
RUN_CHANGE_TYPE_DELETE: RunChangeType

class CreateRolloutsRequest(_message.Message):
    __slots__ = ("rollouts",)
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    rollouts: _containers.RepeatedCompositeFieldContainer[_rollout_pb2.RolloutSpec]
    def __init__(self, rollouts: _Optional[_Iterable[_Union[_rollout_pb2.RolloutSpec, _Mapping]]] = ...) -> None: ...

class CreateRolloutsResponse(_message.Message):
    __slots__ = ("rollouts", "created")
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    rollouts: _containers.RepeatedCompositeFieldContainer[_rollout_pb2.Rollout]
    created: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, rollouts: _Optional[_Iterable[_Union[_rollout_pb2.Rollout, _Mapping]]] = ..., created: _Optional[_Iterable[bool]] = ...) -> None: ...

class GetRolloutRequest(_message.Message):
    __slots__ = ("rollout_id",)
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    rollout_id: str
    def __init__(self, rollout_id: _Optional[str] = ...) -> None: ...

class GetRolloutResponse(_message.Message):
    __slots__ = ("rollout",)
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    rollout: _rollout_pb2.Rollout
    def __init__(self, rollout: _Optional[_Union[_rollout_pb2.Rollout, _Mapping]] = ...) -> None: ...

class ListRolloutsRequest(_message.Message):
    __slots__ = ("states", "label_selector", "controller_id", "page_size", "page_token")
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATES_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[_rollout_pb2.RolloutState]
    label_selector: _containers.ScalarMap[str, str]
    controller_id: str
    page_size: int
    page_token: str
    def __init__(self, states: _Optional[_Iterable[_Union[_rollout_pb2.RolloutState, str]]] = ..., label_selector: _Optional[_Mapping[str, str]] = ..., controller_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRolloutsResponse(_message.Message):
    __slots__ = ("rollouts", "next_page_token")
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    rollouts: _containers.RepeatedCompositeFieldContainer[_rollout_pb2.Rollout]
    next_page_token: str
    def __init__(self, rollouts: _Optional[_Iterable[_Union[_rollout_pb2.Rollout, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteRolloutsRequest(_message.Message):
    __slots__ = ("rollout_ids",)
    ROLLOUT_IDS_FIELD_NUMBER: _ClassVar[int]
    rollout_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rollout_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteRolloutsResponse(_message.Message):
    __slots__ = ("deleted_count",)
    DELETED_COUNT_FIELD_NUMBER: _ClassVar[int]
    deleted_count: int
    def __init__(self, deleted_count: _Optional[int] = ...) -> None: ...

class UpdateRolloutStatusRequest(_message.Message):
    __slots__ = ("rollout_id", "state", "error_message", "attempt_id", "launcher_ref", "controller_id", "expected_version", "failure_reason", "ending_attempt_id")
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    LAUNCHER_REF_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    ENDING_ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    rollout_id: str
    state: _rollout_pb2.RolloutState
    error_message: str
    attempt_id: str
    launcher_ref: str
    controller_id: str
    expected_version: int
    failure_reason: _rollout_pb2.FailureReason
    ending_attempt_id: str
    def __init__(self, rollout_id: _Optional[str] = ..., state: _Optional[_Union[_rollout_pb2.RolloutState, str]] = ..., error_message: _Optional[str] = ..., attempt_id: _Optional[str] = ..., launcher_ref: _Optional[str] = ..., controller_id: _Optional[str] = ..., expected_version: _Optional[int] = ..., failure_reason: _Optional[_Union[_rollout_pb2.FailureReason, str]] = ..., ending_attempt_id: _Optional[str] = ...) -> None: ...

class UpdateRolloutStatusResponse(_message.Message):
    __slots__ = ("rollout",)
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    rollout: _rollout_pb2.Rollout
    def __init__(self, rollout: _Optional[_Union[_rollout_pb2.Rollout, _Mapping]] = ...) -> None: ...

class AppendEventsRequest(_message.Message):
    __slots__ = ("events", "reject_terminal", "allow_terminal")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REJECT_TERMINAL_FIELD_NUMBER: _ClassVar[int]
    ALLOW_TERMINAL_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    reject_terminal: bool
    allow_terminal: bool
    def __init__(self, events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ..., reject_terminal: _Optional[bool] = ..., allow_terminal: _Optional[bool] = ...) -> None: ...

class AppendEventsResponse(_message.Message):
    __slots__ = ("sequences", "attempt_ids")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedScalarFieldContainer[int]
    attempt_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sequences: _Optional[_Iterable[int]] = ..., attempt_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class StreamAppendEventsRequest(_message.Message):
    __slots__ = ("request_id", "append")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    append: AppendEventsRequest
    def __init__(self, request_id: _Optional[int] = ..., append: _Optional[_Union[AppendEventsRequest, _Mapping]] = ...) -> None: ...

class StreamAppendEventsResponse(_message.Message):
    __slots__ = ("request_id", "append", "error_code", "error_message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    append: AppendEventsResponse
    error_code: int
    error_message: str
    def __init__(self, request_id: _Optional[int] = ..., append: _Optional[_Union[AppendEventsResponse, _Mapping]] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("rollout_id", "attempt_id", "event_type", "view", "page_size", "page_token")
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    rollout_id: str
    attempt_id: str
    event_type: str
    view: _event_pb2.EventView
    page_size: int
    page_token: str
    def __init__(self, rollout_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., event_type: _Optional[str] = ..., view: _Optional[_Union[_event_pb2.EventView, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchRolloutsRequest(_message.Message):
    __slots__ = ("states", "label_selector", "after_revision")
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATES_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    AFTER_REVISION_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[_rollout_pb2.RolloutState]
    label_selector: _containers.ScalarMap[str, str]
    after_revision: int
    def __init__(self, states: _Optional[_Iterable[_Union[_rollout_pb2.RolloutState, str]]] = ..., label_selector: _Optional[_Mapping[str, str]] = ..., after_revision: _Optional[int] = ...) -> None: ...

class WatchRolloutsResponse(_message.Message):
    __slots__ = ("type", "revision", "rollout")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    type: RolloutChangeType
    revision: int
    rollout: _rollout_pb2.Rollout
    def __init__(self, type: _Optional[_Union[RolloutChangeType, str]] = ..., revision: _Optional[int] = ..., rollout: _Optional[_Union[_rollout_pb2.Rollout, _Mapping]] = ...) -> None: ...

class WatchTerminalRolloutsRequest(_message.Message):
    __slots__ = ("after_cursor", "label_selector", "include_events")
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AFTER_CURSOR_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    after_cursor: int
    label_selector: _containers.ScalarMap[str, str]
    include_events: bool
    def __init__(self, after_cursor: _Optional[int] = ..., label_selector: _Optional[_Mapping[str, str]] = ..., include_events: _Optional[bool] = ...) -> None: ...

class TerminalRollout(_message.Message):
    __slots__ = ("cursor", "rollout", "events")
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    cursor: int
    rollout: _rollout_pb2.Rollout
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    def __init__(self, cursor: _Optional[int] = ..., rollout: _Optional[_Union[_rollout_pb2.Rollout, _Mapping]] = ..., events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ...) -> None: ...

class WatchTerminalRolloutsResponse(_message.Message):
    __slots__ = ("entry",)
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    entry: TerminalRollout
    def __init__(self, entry: _Optional[_Union[TerminalRollout, _Mapping]] = ...) -> None: ...

class ListTerminalRolloutsRequest(_message.Message):
    __slots__ = ("after_cursor", "label_selector", "include_events", "page_size")
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AFTER_CURSOR_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    after_cursor: int
    label_selector: _containers.ScalarMap[str, str]
    include_events: bool
    page_size: int
    def __init__(self, after_cursor: _Optional[int] = ..., label_selector: _Optional[_Mapping[str, str]] = ..., include_events: _Optional[bool] = ..., page_size: _Optional[int] = ...) -> None: ...

class ListTerminalRolloutsResponse(_message.Message):
    __slots__ = ("entries", "next_cursor")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[TerminalRollout]
    next_cursor: int
    def __init__(self, entries: _Optional[_Iterable[_Union[TerminalRollout, _Mapping]]] = ..., next_cursor: _Optional[int] = ...) -> None: ...

class RegisterModelsRequest(_message.Message):
    __slots__ = ("endpoints",)
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedCompositeFieldContainer[_model_pb2.ModelEndpoint]
    def __init__(self, endpoints: _Optional[_Iterable[_Union[_model_pb2.ModelEndpoint, _Mapping]]] = ...) -> None: ...

class RegisterModelsResponse(_message.Message):
    __slots__ = ("endpoints",)
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedCompositeFieldContainer[_model_pb2.ModelEndpoint]
    def __init__(self, endpoints: _Optional[_Iterable[_Union[_model_pb2.ModelEndpoint, _Mapping]]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ("model_name", "page_size", "page_token")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    page_size: int
    page_token: str
    def __init__(self, model_name: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("endpoints", "next_page_token")
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedCompositeFieldContainer[_model_pb2.ModelEndpoint]
    next_page_token: str
    def __init__(self, endpoints: _Optional[_Iterable[_Union[_model_pb2.ModelEndpoint, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteModelsRequest(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[_model_pb2.ModelEndpointKey]
    def __init__(self, keys: _Optional[_Iterable[_Union[_model_pb2.ModelEndpointKey, _Mapping]]] = ...) -> None: ...

class DeleteModelsResponse(_message.Message):
    __slots__ = ("deleted_count",)
    DELETED_COUNT_FIELD_NUMBER: _ClassVar[int]
    deleted_count: int
    def __init__(self, deleted_count: _Optional[int] = ...) -> None: ...

class WatchModelsRequest(_message.Message):
    __slots__ = ("model_name",)
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    def __init__(self, model_name: _Optional[str] = ...) -> None: ...

class WatchModelsResponse(_message.Message):
    __slots__ = ("revision", "endpoints")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    endpoints: _containers.RepeatedCompositeFieldContainer[_model_pb2.ModelEndpoint]
    def __init__(self, revision: _Optional[int] = ..., endpoints: _Optional[_Iterable[_Union[_model_pb2.ModelEndpoint, _Mapping]]] = ...) -> None: ...

class SetProxyPauseRequest(_message.Message):
    __slots__ = ("paused", "retry_after_seconds", "reason", "owner", "lease_seconds", "model_name")
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    paused: bool
    retry_after_seconds: int
    reason: str
    owner: str
    lease_seconds: float
    model_name: str
    def __init__(self, paused: _Optional[bool] = ..., retry_after_seconds: _Optional[int] = ..., reason: _Optional[str] = ..., owner: _Optional[str] = ..., lease_seconds: _Optional[float] = ..., model_name: _Optional[str] = ...) -> None: ...

class SetProxyPauseResponse(_message.Message):
    __slots__ = ("control",)
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    control: _proxy_control_pb2.ProxyControl
    def __init__(self, control: _Optional[_Union[_proxy_control_pb2.ProxyControl, _Mapping]] = ...) -> None: ...

class ReportProxyReplicaRequest(_message.Message):
    __slots__ = ("replica_id", "in_flight", "observed_generation", "ttl_seconds", "leaving", "model_in_flight")
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
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    MODEL_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    in_flight: int
    observed_generation: int
    ttl_seconds: float
    leaving: bool
    model_in_flight: _containers.ScalarMap[str, int]
    def __init__(self, replica_id: _Optional[str] = ..., in_flight: _Optional[int] = ..., observed_generation: _Optional[int] = ..., ttl_seconds: _Optional[float] = ..., leaving: _Optional[bool] = ..., model_in_flight: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ReportProxyReplicaResponse(_message.Message):
    __slots__ = ("control",)
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    control: _proxy_control_pb2.ProxyControl
    def __init__(self, control: _Optional[_Union[_proxy_control_pb2.ProxyControl, _Mapping]] = ...) -> None: ...

class GetProxyControlRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetProxyControlResponse(_message.Message):
    __slots__ = ("control",)
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    control: _proxy_control_pb2.ProxyControl
    def __init__(self, control: _Optional[_Union[_proxy_control_pb2.ProxyControl, _Mapping]] = ...) -> None: ...

class WatchProxyControlRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchProxyControlResponse(_message.Message):
    __slots__ = ("control",)
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    control: _proxy_control_pb2.ProxyControl
    def __init__(self, control: _Optional[_Union[_proxy_control_pb2.ProxyControl, _Mapping]] = ...) -> None: ...

class RenewControllerLeaseRequest(_message.Message):
    __slots__ = ("controller_id", "ttl_seconds", "leaving")
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    controller_id: str
    ttl_seconds: float
    leaving: bool
    def __init__(self, controller_id: _Optional[str] = ..., ttl_seconds: _Optional[float] = ..., leaving: _Optional[bool] = ...) -> None: ...

class RenewControllerLeaseResponse(_message.Message):
    __slots__ = ("lease", "expired_leases")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_LEASES_FIELD_NUMBER: _ClassVar[int]
    lease: _controller_lease_pb2.ControllerLease
    expired_leases: _containers.RepeatedCompositeFieldContainer[_controller_lease_pb2.ControllerLease]
    def __init__(self, lease: _Optional[_Union[_controller_lease_pb2.ControllerLease, _Mapping]] = ..., expired_leases: _Optional[_Iterable[_Union[_controller_lease_pb2.ControllerLease, _Mapping]]] = ...) -> None: ...

class CreateRunRequest(_message.Message):
    __slots__ = ("run_id", "labels", "config_json")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    labels: _containers.ScalarMap[str, str]
    config_json: str
    def __init__(self, run_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., config_json: _Optional[str] = ...) -> None: ...

class CreateRunResponse(_message.Message):
    __slots__ = ("run", "created")
    RUN_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    run: _run_pb2.Run
    created: bool
    def __init__(self, run: _Optional[_Union[_run_pb2.Run, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _run_pb2.Run
    def __init__(self, run: _Optional[_Union[_run_pb2.Run, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("label_selector", "states", "page_size", "page_token")
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    label_selector: _containers.ScalarMap[str, str]
    states: _containers.RepeatedScalarFieldContainer[_run_pb2.RunState]
    page_size: int
    page_token: str
    def __init__(self, label_selector: _Optional[_Mapping[str, str]] = ..., states: _Optional[_Iterable[_Union[_run_pb2.RunState, str]]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[_run_pb2.Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[_run_pb2.Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpdateRunStateRequest(_message.Message):
    __slots__ = ("run_id", "state", "error_message")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    state: _run_pb2.RunState
    error_message: str
    def __init__(self, run_id: _Optional[str] = ..., state: _Optional[_Union[_run_pb2.RunState, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class UpdateRunStateResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _run_pb2.Run
    def __init__(self, run: _Optional[_Union[_run_pb2.Run, _Mapping]] = ...) -> None: ...

class DeleteRunsRequest(_message.Message):
    __slots__ = ("run_ids",)
    RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    run_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteRunsResponse(_message.Message):
    __slots__ = ("deleted_count",)
    DELETED_COUNT_FIELD_NUMBER: _ClassVar[int]
    deleted_count: int
    def __init__(self, deleted_count: _Optional[int] = ...) -> None: ...

class ReportRunStepsRequest(_message.Message):
    __slots__ = ("run_id", "steps")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    steps: _containers.RepeatedCompositeFieldContainer[_run_pb2.RunStep]
    def __init__(self, run_id: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[_run_pb2.RunStep, _Mapping]]] = ...) -> None: ...

class ReportRunStepsResponse(_message.Message):
    __slots__ = ("steps", "run")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[_run_pb2.RunStep]
    run: _run_pb2.Run
    def __init__(self, steps: _Optional[_Iterable[_Union[_run_pb2.RunStep, _Mapping]]] = ..., run: _Optional[_Union[_run_pb2.Run, _Mapping]] = ...) -> None: ...

class ListRunStepsRequest(_message.Message):
    __slots__ = ("run_id", "after_step", "metric_names", "page_size", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_STEP_FIELD_NUMBER: _ClassVar[int]
    METRIC_NAMES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    after_step: int
    metric_names: _containers.RepeatedScalarFieldContainer[str]
    page_size: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., after_step: _Optional[int] = ..., metric_names: _Optional[_Iterable[str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunStepsResponse(_message.Message):
    __slots__ = ("steps", "next_page_token")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[_run_pb2.RunStep]
    next_page_token: str
    def __init__(self, steps: _Optional[_Iterable[_Union[_run_pb2.RunStep, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchRunsRequest(_message.Message):
    __slots__ = ("run_id", "label_selector", "include_steps", "after_revision")
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STEPS_FIELD_NUMBER: _ClassVar[int]
    AFTER_REVISION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    label_selector: _containers.ScalarMap[str, str]
    include_steps: bool
    after_revision: int
    def __init__(self, run_id: _Optional[str] = ..., label_selector: _Optional[_Mapping[str, str]] = ..., include_steps: _Optional[bool] = ..., after_revision: _Optional[int] = ...) -> None: ...

class WatchRunsResponse(_message.Message):
    __slots__ = ("type", "revision", "run", "step")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    type: RunChangeType
    revision: int
    run: _run_pb2.Run
    step: _run_pb2.RunStep
    def __init__(self, type: _Optional[_Union[RunChangeType, str]] = ..., revision: _Optional[int] = ..., run: _Optional[_Union[_run_pb2.Run, _Mapping]] = ..., step: _Optional[_Union[_run_pb2.RunStep, _Mapping]] = ...) -> None: ...
