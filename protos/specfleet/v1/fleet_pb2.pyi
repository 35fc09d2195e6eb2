from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Fingerprint(_message.Message):
    __slots__ = ("hostname", "os", "os_version", "chip", "gpu_cores", "performance_cores", "efficiency_cores", "memory_bytes", "model_identifier", "memory_bandwidth_bytes_per_second", "gpus", "engine_versions", "unavailable", "cpu_cores", "hardware_digest")
    class EngineVersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    OS_FIELD_NUMBER: _ClassVar[int]
    OS_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHIP_FIELD_NUMBER: _ClassVar[int]
    GPU_CORES_FIELD_NUMBER: _ClassVar[int]
    PERFORMANCE_CORES_FIELD_NUMBER: _ClassVar[int]
    EFFICIENCY_CORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODEL_IDENTIFIER_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BANDWIDTH_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    os: str
    os_version: str
    chip: str
    gpu_cores: int
    performance_cores: int
    efficiency_cores: int
    memory_bytes: int
    model_identifier: str
    memory_bandwidth_bytes_per_second: float
    gpus: _containers.RepeatedScalarFieldContainer[str]
    engine_versions: _containers.ScalarMap[str, str]
    unavailable: _containers.RepeatedScalarFieldContainer[str]
    cpu_cores: int
    hardware_digest: str
    def __init__(self, hostname: _Optional[str] = ..., os: _Optional[str] = ..., os_version: _Optional[str] = ..., chip: _Optional[str] = ..., gpu_cores: _Optional[int] = ..., performance_cores: _Optional[int] = ..., efficiency_cores: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., model_identifier: _Optional[str] = ..., memory_bandwidth_bytes_per_second: _Optional[float] = ..., gpus: _Optional[_Iterable[str]] = ..., engine_versions: _Optional[_Mapping[str, str]] = ..., unavailable: _Optional[_Iterable[str]] = ..., cpu_cores: _Optional[int] = ..., hardware_digest: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "lease_id", "sweep_id", "attempt", "lease_seconds", "spec_json")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lease_id: str
    sweep_id: str
    attempt: int
    lease_seconds: float
    spec_json: str
    def __init__(self, job_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., sweep_id: _Optional[str] = ..., attempt: _Optional[int] = ..., lease_seconds: _Optional[float] = ..., spec_json: _Optional[str] = ...) -> None: ...

class EnrolRequest(_message.Message):
    __slots__ = ("token", "name", "fingerprint", "labels", "engines")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    token: str
    name: str
    fingerprint: Fingerprint
    labels: _containers.ScalarMap[str, str]
    engines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, token: _Optional[str] = ..., name: _Optional[str] = ..., fingerprint: _Optional[_Union[Fingerprint, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., engines: _Optional[_Iterable[str]] = ...) -> None: ...

class EnrolResponse(_message.Message):
    __slots__ = ("agent_id", "credential", "heartbeat_interval_seconds", "lease_seconds", "max_record_schema")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORD_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    credential: str
    heartbeat_interval_seconds: float
    lease_seconds: float
    max_record_schema: int
    def __init__(self, agent_id: _Optional[str] = ..., credential: _Optional[str] = ..., heartbeat_interval_seconds: _Optional[float] = ..., lease_seconds: _Optional[float] = ..., max_record_schema: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("job_id", "lease_id", "status", "fingerprint")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lease_id: str
    status: str
    fingerprint: Fingerprint
    def __init__(self, job_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., status: _Optional[str] = ..., fingerprint: _Optional[_Union[Fingerprint, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("lease_valid", "lease_expires_in_seconds", "drain", "max_record_schema")
    LEASE_VALID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORD_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    lease_valid: bool
    lease_expires_in_seconds: float
    drain: bool
    max_record_schema: int
    def __init__(self, lease_valid: _Optional[bool] = ..., lease_expires_in_seconds: _Optional[float] = ..., drain: _Optional[bool] = ..., max_record_schema: _Optional[int] = ...) -> None: ...

class AcquireJobRequest(_message.Message):
    __slots__ = ("wait_seconds",)
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    wait_seconds: float
    def __init__(self, wait_seconds: _Optional[float] = ...) -> None: ...

class AcquireJobResponse(_message.Message):
    __slots__ = ("has_job", "job", "max_record_schema")
    HAS_JOB_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORD_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    has_job: bool
    job: Job
    max_record_schema: int
    def __init__(self, has_job: _Optional[bool] = ..., job: _Optional[_Union[Job, _Mapping]] = ..., max_record_schema: _Optional[int] = ...) -> None: ...

class ReportResultRequest(_message.Message):
    __slots__ = ("job_id", "lease_id", "record_json")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_JSON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lease_id: str
    record_json: str
    def __init__(self, job_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., record_json: _Optional[str] = ...) -> None: ...

class ReportResultResponse(_message.Message):
    __slots__ = ("duplicate", "ingest_seq")
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    INGEST_SEQ_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    ingest_seq: int
    def __init__(self, duplicate: _Optional[bool] = ..., ingest_seq: _Optional[int] = ...) -> None: ...

class CompleteJobRequest(_message.Message):
    __slots__ = ("job_id", "lease_id", "run_count", "held_runs")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_COUNT_FIELD_NUMBER: _ClassVar[int]
    HELD_RUNS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lease_id: str
    run_count: int
    held_runs: int
    def __init__(self, job_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., run_count: _Optional[int] = ..., held_runs: _Optional[int] = ...) -> None: ...

class CompleteJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FailJobRequest(_message.Message):
    __slots__ = ("job_id", "lease_id", "reason", "refused")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lease_id: str
    reason: str
    refused: bool
    def __init__(self, job_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., reason: _Optional[str] = ..., refused: _Optional[bool] = ...) -> None: ...

class FailJobResponse(_message.Message):
    __slots__ = ("will_retry",)
    WILL_RETRY_FIELD_NUMBER: _ClassVar[int]
    will_retry: bool
    def __init__(self, will_retry: _Optional[bool] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ("agent_id", "name", "server_time_unix_seconds")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    name: str
    server_time_unix_seconds: float
    def __init__(self, agent_id: _Optional[str] = ..., name: _Optional[str] = ..., server_time_unix_seconds: _Optional[float] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("ttl_seconds", "max_uses", "note")
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_USES_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    ttl_seconds: float
    max_uses: int
    note: str
    def __init__(self, ttl_seconds: _Optional[float] = ..., max_uses: _Optional[int] = ..., note: _Optional[str] = ...) -> None: ...

class CreateTokenResponse(_message.Message):
    __slots__ = ("token", "expires_at_unix_seconds")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    token: str
    expires_at_unix_seconds: float
    def __init__(self, token: _Optional[str] = ..., expires_at_unix_seconds: _Optional[float] = ...) -> None: ...

class Agent(_message.Message):
    __slots__ = ("agent_id", "name", "state", "fingerprint", "labels", "engines", "last_seen_unix_seconds", "current_job_id", "status")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    name: str
    state: str
    fingerprint: Fingerprint
    labels: _containers.ScalarMap[str, str]
    engines: _containers.RepeatedScalarFieldContainer[str]
    last_seen_unix_seconds: float
    current_job_id: str
    status: str
    def __init__(self, agent_id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., fingerprint: _Optional[_Union[Fingerprint, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., engines: _Optional[_Iterable[str]] = ..., last_seen_unix_seconds: _Optional[float] = ..., current_job_id: _Optional[str] = ..., status: _Optional[str] = ...) -> None: ...

class ListAgentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListAgentsResponse(_message.Message):
    __slots__ = ("agents",)
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[Agent]
    def __init__(self, agents: _Optional[_Iterable[_Union[Agent, _Mapping]]] = ...) -> None: ...

class SubmitSweepRequest(_message.Message):
    __slots__ = ("yaml",)
    YAML_FIELD_NUMBER: _ClassVar[int]
    yaml: str
    def __init__(self, yaml: _Optional[str] = ...) -> None: ...

class SubmitSweepResponse(_message.Message):
    __slots__ = ("sweep_id", "jobs", "notes", "uncovered")
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    UNCOVERED_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    jobs: int
    notes: _containers.RepeatedScalarFieldContainer[str]
    uncovered: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sweep_id: _Optional[str] = ..., jobs: _Optional[int] = ..., notes: _Optional[_Iterable[str]] = ..., uncovered: _Optional[_Iterable[str]] = ...) -> None: ...

class SweepStatus(_message.Message):
    __slots__ = ("sweep_id", "name", "state", "jobs_total", "jobs_queued", "jobs_running", "jobs_done", "jobs_failed", "runs", "created_at_unix_seconds", "failures", "runs_expected", "eta_seconds", "agents", "jobs_refused", "uncovered", "jobs_held", "runs_held")
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    JOBS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    JOBS_QUEUED_FIELD_NUMBER: _ClassVar[int]
    JOBS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    JOBS_DONE_FIELD_NUMBER: _ClassVar[int]
    JOBS_FAILED_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    RUNS_EXPECTED_FIELD_NUMBER: _ClassVar[int]
    ETA_SECONDS_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    JOBS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    UNCOVERED_FIELD_NUMBER: _ClassVar[int]
    JOBS_HELD_FIELD_NUMBER: _ClassVar[int]
    RUNS_HELD_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    name: str
    state: str
    jobs_total: int
    jobs_queued: int
    jobs_running: int
    jobs_done: int
    jobs_failed: int
    runs: int
    created_at_unix_seconds: float
    failures: _containers.RepeatedScalarFieldContainer[str]
    runs_expected: int
    eta_seconds: float
    agents: _containers.RepeatedCompositeFieldContainer[AgentProgress]
    jobs_refused: int
    uncovered: _containers.RepeatedScalarFieldContainer[str]
    jobs_held: int
    runs_held: int
    def __init__(self, sweep_id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., jobs_total: _Optional[int] = ..., jobs_queued: _Optional[int] = ..., jobs_running: _Optional[int] = ..., jobs_done: _Optional[int] = ..., jobs_failed: _Optional[int] = ..., runs: _Optional[int] = ..., created_at_unix_seconds: _Optional[float] = ..., failures: _Optional[_Iterable[str]] = ..., runs_expected: _Optional[int] = ..., eta_seconds: _Optional[float] = ..., agents: _Optional[_Iterable[_Union[AgentProgress, _Mapping]]] = ..., jobs_refused: _Optional[int] = ..., uncovered: _Optional[_Iterable[str]] = ..., jobs_held: _Optional[int] = ..., runs_held: _Optional[int] = ...) -> None: ...

class AgentProgress(_message.Message):
    __slots__ = ("agent_id", "name", "job_id", "cell", "arm", "runs", "runs_expected")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CELL_FIELD_NUMBER: _ClassVar[int]
    ARM_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    RUNS_EXPECTED_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    name: str
    job_id: str
    cell: str
    arm: str
    runs: int
    runs_expected: int
    def __init__(self, agent_id: _Optional[str] = ..., name: _Optional[str] = ..., job_id: _Optional[str] = ..., cell: _Optional[str] = ..., arm: _Optional[str] = ..., runs: _Optional[int] = ..., runs_expected: _Optional[int] = ...) -> None: ...

class GetSweepRequest(_message.Message):
    __slots__ = ("sweep_id",)
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    def __init__(self, sweep_id: _Optional[str] = ...) -> None: ...

class ListSweepsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSweepsResponse(_message.Message):
    __slots__ = ("sweeps",)
    SWEEPS_FIELD_NUMBER: _ClassVar[int]
    sweeps: _containers.RepeatedCompositeFieldContainer[SweepStatus]
    def __init__(self, sweeps: _Optional[_Iterable[_Union[SweepStatus, _Mapping]]] = ...) -> None: ...

class ExportRequest(_message.Message):
    __slots__ = ("table", "after_seq", "limit")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    table: str
    after_seq: int
    limit: int
    def __init__(self, table: _Optional[str] = ..., after_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ExportResponse(_message.Message):
    __slots__ = ("arrow_ipc", "last_seq", "rows")
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    arrow_ipc: bytes
    last_seq: int
    rows: int
    def __init__(self, arrow_ipc: _Optional[bytes] = ..., last_seq: _Optional[int] = ..., rows: _Optional[int] = ...) -> None: ...

class SetAgentStateRequest(_message.Message):
    __slots__ = ("agent_id", "state")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    state: str
    def __init__(self, agent_id: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class SetAgentStateResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CancelSweepRequest(_message.Message):
    __slots__ = ("sweep_id",)
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    def __init__(self, sweep_id: _Optional[str] = ...) -> None: ...

class CancelSweepResponse(_message.Message):
    __slots__ = ("jobs_cancelled",)
    JOBS_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    jobs_cancelled: int
    def __init__(self, jobs_cancelled: _Optional[int] = ...) -> None: ...

class ImportedResult(_message.Message):
    __slots__ = ("tool", "tool_version", "source_file", "source_sha256", "source_line", "machine", "model", "test", "method", "draft_depth", "n_prompt", "n_gen", "n_depth", "tokens_per_second", "tokens_per_second_stddev", "has_stddev", "samples_tokens_per_second", "acceptance_by_depth", "quality_gates_json", "measured_at", "fields_json")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    TOOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FILE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_SHA256_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LINE_FIELD_NUMBER: _ClassVar[int]
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEST_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    DRAFT_DEPTH_FIELD_NUMBER: _ClassVar[int]
    N_PROMPT_FIELD_NUMBER: _ClassVar[int]
    N_GEN_FIELD_NUMBER: _ClassVar[int]
    N_DEPTH_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_STDDEV_FIELD_NUMBER: _ClassVar[int]
    HAS_STDDEV_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_BY_DEPTH_FIELD_NUMBER: _ClassVar[int]
    QUALITY_GATES_JSON_FIELD_NUMBER: _ClassVar[int]
    MEASURED_AT_FIELD_NUMBER: _ClassVar[int]
    FIELDS_JSON_FIELD_NUMBER: _ClassVar[int]
    tool: str
    tool_version: str
    source_file: str
    source_sha256: str
    source_line: int
    machine: str
    model: str
    test: str
    method: str
    draft_depth: int
    n_prompt: int
    n_gen: int
    n_depth: int
    tokens_per_second: float
    tokens_per_second_stddev: float
    has_stddev: bool
    samples_tokens_per_second: _containers.RepeatedScalarFieldContainer[float]
    acceptance_by_depth: _containers.RepeatedScalarFieldContainer[float]
    quality_gates_json: str
    measured_at: str
    fields_json: str
    def __init__(self, tool: _Optional[str] = ..., tool_version: _Optional[str] = ..., source_file: _Optional[str] = ..., source_sha256: _Optional[str] = ..., source_line: _Optional[int] = ..., machine: _Optional[str] = ..., model: _Optional[str] = ..., test: _Optional[str] = ..., method: _Optional[str] = ..., draft_depth: _Optional[int] = ..., n_prompt: _Optional[int] = ..., n_gen: _Optional[int] = ..., n_depth: _Optional[int] = ..., tokens_per_second: _Optional[float] = ..., tokens_per_second_stddev: _Optional[float] = ..., has_stddev: _Optional[bool] = ..., samples_tokens_per_second: _Optional[_Iterable[float]] = ..., acceptance_by_depth: _Optional[_Iterable[float]] = ..., quality_gates_json: _Optional[str] = ..., measured_at: _Optional[str] = ..., fields_json: _Optional[str] = ...) -> None: ...

class ImportResultsRequest(_message.Message):
    __slots__ = ("results", "machine_note", "local_user")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    MACHINE_NOTE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_USER_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ImportedResult]
    machine_note: str
    local_user: str
    def __init__(self, results: _Optional[_Iterable[_Union[ImportedResult, _Mapping]]] = ..., machine_note: _Optional[str] = ..., local_user: _Optional[str] = ...) -> None: ...

class ImportResultsResponse(_message.Message):
    __slots__ = ("stored", "duplicates", "imported_by")
    STORED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    IMPORTED_BY_FIELD_NUMBER: _ClassVar[int]
    stored: int
    duplicates: int
    imported_by: str
    def __init__(self, stored: _Optional[int] = ..., duplicates: _Optional[int] = ..., imported_by: _Optional[str] = ...) -> None: ...
