from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Quality(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUALITY_UNSPECIFIED: _ClassVar[Quality]
    QUALITY_COUNTER: _ClassVar[Quality]
    QUALITY_INTEGRATED: _ClassVar[Quality]
    QUALITY_MODEL: _ClassVar[Quality]
QUALITY_UNSPECIFIED: Quality
QUALITY_COUNTER: Quality
QUALITY_INTEGRATED: Quality
QUALITY_MODEL: Quality

class Host(_message.Message):
    __slots__ = ("host_id", "labels", "agent_version")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    labels: _containers.ScalarMap[str, str]
    agent_version: str
    def __init__(self, host_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., agent_version: _Optional[str] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("source", "component", "device", "start_ns", "end_ns", "energy_j", "power_w", "cumulative_j", "utilization", "quality", "healthy", "status", "energy_error_j", "gauges")
    class GaugesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    COMPONENT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    CUMULATIVE_J_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ENERGY_ERROR_J_FIELD_NUMBER: _ClassVar[int]
    GAUGES_FIELD_NUMBER: _ClassVar[int]
    source: str
    component: str
    device: str
    start_ns: int
    end_ns: int
    energy_j: float
    power_w: float
    cumulative_j: float
    utilization: float
    quality: Quality
    healthy: bool
    status: str
    energy_error_j: float
    gauges: _containers.ScalarMap[str, float]
    def __init__(self, source: _Optional[str] = ..., component: _Optional[str] = ..., device: _Optional[str] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., energy_j: _Optional[float] = ..., power_w: _Optional[float] = ..., cumulative_j: _Optional[float] = ..., utilization: _Optional[float] = ..., quality: _Optional[_Union[Quality, str]] = ..., healthy: _Optional[bool] = ..., status: _Optional[str] = ..., energy_error_j: _Optional[float] = ..., gauges: _Optional[_Mapping[str, float]] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("job_id", "kind", "time_ns", "event_seq", "name", "job_kind", "unit_name", "labels", "devices", "units", "phase", "exit_code", "use_device", "use_period_ns", "job_use", "device_use", "use_metric", "use_scope", "units_total", "abandoned", "holder_pid", "holder_start_ticks", "holder_boot_id", "end_state", "use_steady", "pod_containers", "pod_end", "unit", "unit_labels", "latency_le", "latency_counts", "latency_sum_s", "service")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[JobEvent.Kind]
        KIND_OPEN: _ClassVar[JobEvent.Kind]
        KIND_UNITS: _ClassVar[JobEvent.Kind]
        KIND_PHASE: _ClassVar[JobEvent.Kind]
        KIND_CLOSE: _ClassVar[JobEvent.Kind]
        KIND_HEARTBEAT: _ClassVar[JobEvent.Kind]
        KIND_USE: _ClassVar[JobEvent.Kind]
        KIND_LATENCY: _ClassVar[JobEvent.Kind]
    KIND_UNSPECIFIED: JobEvent.Kind
    KIND_OPEN: JobEvent.Kind
    KIND_UNITS: JobEvent.Kind
    KIND_PHASE: JobEvent.Kind
    KIND_CLOSE: JobEvent.Kind
    KIND_HEARTBEAT: JobEvent.Kind
    KIND_USE: JobEvent.Kind
    KIND_LATENCY: JobEvent.Kind
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class UnitLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    EVENT_SEQ_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_KIND_FIELD_NUMBER: _ClassVar[int]
    UNIT_NAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    USE_DEVICE_FIELD_NUMBER: _ClassVar[int]
    USE_PERIOD_NS_FIELD_NUMBER: _ClassVar[int]
    JOB_USE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_USE_FIELD_NUMBER: _ClassVar[int]
    USE_METRIC_FIELD_NUMBER: _ClassVar[int]
    USE_SCOPE_FIELD_NUMBER: _ClassVar[int]
    UNITS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_FIELD_NUMBER: _ClassVar[int]
    HOLDER_PID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_START_TICKS_FIELD_NUMBER: _ClassVar[int]
    HOLDER_BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    END_STATE_FIELD_NUMBER: _ClassVar[int]
    USE_STEADY_FIELD_NUMBER: _ClassVar[int]
    POD_CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    POD_END_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    UNIT_LABELS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_LE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_COUNTS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_SUM_S_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    kind: JobEvent.Kind
    time_ns: int
    event_seq: int
    name: str
    job_kind: str
    unit_name: str
    labels: _containers.ScalarMap[str, str]
    devices: _containers.RepeatedScalarFieldContainer[str]
    units: float
    phase: str
    exit_code: int
    use_device: str
    use_period_ns: int
    job_use: float
    device_use: float
    use_metric: str
    use_scope: _containers.RepeatedScalarFieldContainer[str]
    units_total: float
    abandoned: str
    holder_pid: int
    holder_start_ticks: int
    holder_boot_id: str
    end_state: str
    use_steady: bool
    pod_containers: str
    pod_end: str
    unit: str
    unit_labels: _containers.ScalarMap[str, str]
    latency_le: _containers.RepeatedScalarFieldContainer[float]
    latency_counts: _containers.RepeatedScalarFieldContainer[float]
    latency_sum_s: float
    service: bool
    def __init__(self, job_id: _Optional[str] = ..., kind: _Optional[_Union[JobEvent.Kind, str]] = ..., time_ns: _Optional[int] = ..., event_seq: _Optional[int] = ..., name: _Optional[str] = ..., job_kind: _Optional[str] = ..., unit_name: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., devices: _Optional[_Iterable[str]] = ..., units: _Optional[float] = ..., phase: _Optional[str] = ..., exit_code: _Optional[int] = ..., use_device: _Optional[str] = ..., use_period_ns: _Optional[int] = ..., job_use: _Optional[float] = ..., device_use: _Optional[float] = ..., use_metric: _Optional[str] = ..., use_scope: _Optional[_Iterable[str]] = ..., units_total: _Optional[float] = ..., abandoned: _Optional[str] = ..., holder_pid: _Optional[int] = ..., holder_start_ticks: _Optional[int] = ..., holder_boot_id: _Optional[str] = ..., end_state: _Optional[str] = ..., use_steady: _Optional[bool] = ..., pod_containers: _Optional[str] = ..., pod_end: _Optional[str] = ..., unit: _Optional[str] = ..., unit_labels: _Optional[_Mapping[str, str]] = ..., latency_le: _Optional[_Iterable[float]] = ..., latency_counts: _Optional[_Iterable[float]] = ..., latency_sum_s: _Optional[float] = ..., service: _Optional[bool] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("stream_id", "seq", "host", "samples", "job_events", "sent_ns")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    JOB_EVENTS_FIELD_NUMBER: _ClassVar[int]
    SENT_NS_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    seq: int
    host: Host
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    job_events: _containers.RepeatedCompositeFieldContainer[JobEvent]
    sent_ns: int
    def __init__(self, stream_id: _Optional[str] = ..., seq: _Optional[int] = ..., host: _Optional[_Union[Host, _Mapping]] = ..., samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., job_events: _Optional[_Iterable[_Union[JobEvent, _Mapping]]] = ..., sent_ns: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("stream_id", "seq", "written", "rejected", "message")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    seq: int
    written: int
    rejected: int
    message: str
    def __init__(self, stream_id: _Optional[str] = ..., seq: _Optional[int] = ..., written: _Optional[int] = ..., rejected: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...
