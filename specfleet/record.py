"""The vocabulary the agent, the coordinator and the dashboard share, and the typed run record.

One module, imported by all three, so that no package imports another for a name. A run is a
`RunRecord`: immutable, validated in its constructor, schema-versioned (pyperf's `Run`). It and
the job spec's parts are strict pydantic dataclasses (specfleet/schemas.py `model`): each field's
type and bounds are its annotation, the rules between fields are `RULES`, and one InvalidRecord
names every faulty field. The worker builds it once; the spool, the protocol
(`ReportResultRequest.record_json`), ingest, the store (one column per leaf field,
`RunRecord.row()`) and the export carry it unchanged. A job's cell is a `JobSpec`, its defaults the
declaration's.

A setting (anything that can change a measurement) is declared in specfleet/settings.py; the
record carries the declared settings in its `settings` part (one store column each, named as the
setting) and its checked keys are the declaration's. Adding a measured field to the record touches
this file, a numbered store migration that adds its column, a version of SCHEMA_HISTORY and the page
that shows it: ingest and export follow `RunRecord.columns()`.

The record's schema version moves with every field (the history below, `SCHEMA_HISTORY`, and the
declared rows' `since`). A record of an older version is read with the fields it predates unknown
(None, never a guessed value); a record of a newer version is refused with `NewerSchema`, which the
coordinator answers so that the agent holds it until the coordinator is upgraded.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from typing import Annotated, Any, get_type_hints

from pydantic import AfterValidator, Field

from specfleet import settings as declared
from specfleet.schemas import (
    STRICT,
    Bool,
    Float,
    Int,
    Settings,
    SettingsField,
    Sha256,
    Str,
    between,
    model,
    one_of,
    refuse,
    setting_type,
    text,
)

# Record schema history (as pyperf writes its format history), the one table of it: each version, what
# it added (the store migration that added the columns), and the record's own fields it added (a field
# path: "power_mode", "divergence"; one named by no version is the first's). A declared setting
# (specfleet/settings.py: a cell's setting, "settings.<name>"; a sampler field, "sampler.<key>") is added
# by its row's `since` alone, never named here: a row whose `since` is past the last version below makes
# a version of its own, and SCHEMA_VERSION moves with it. docs/sweeps.md lists every version's fields.
SCHEMA_HISTORY: dict[int, tuple[str, tuple[str, ...]]] = {
    1: ("the first record", ()),
    2: ("the system under test (migration 003), the accelerator (005), the power mode (007)",
        ("system", "server_version", "server_command", "server_decode_tokens_per_second", "server_prefill_seconds",
         "timings_disagree", "drafter_warm", "interleaving", "backend", "energy_source", "energy_joules",
         "joules_per_token", "power_mode")),
    3: ("the declared settings, one column each (008)", ()),
    4: ("where an output diverged, the drafter's warning and a text sample (011); settings of 009, 012",
        ("divergence", "divergence_position", "divergence_token", "divergence_reference_token",
         "divergence_margin", "divergence_threshold", "drafter_warning", "text_sample")),
    5: ("the machine's memory as a setting (014)", ()),
    6: ("sampler min_p (015), the drafter's start (019)", ()),
    7: ("IOReport's split of a Mac run's energy (025); env_before/env_after thermal_pressure (026), a part's "
        "field that an older record lacks (None)",
        ("energy_cpu_joules", "energy_gpu_joules", "energy_ane_joules", "energy_dram_joules")),
    8: ("sampler xtc_probability (027)", ()),
    9: ("why a greedy divergence has no margin (028)", ("divergence_cause",)),
}  # fmt: skip


def _field_versions() -> dict[str, int]:
    """Field path -> the version that added it: the history's own fields and the declared rows' `since`."""
    return {
        **{path: version for version, (_, paths) in SCHEMA_HISTORY.items() for path in paths},
        "settings": min(s.since for s in declared.CARRIED),
        **{f"settings.{s.name}": s.since for s in declared.CARRIED},
        **{f"{s.part}.{s.key}": s.since for s in declared.DECLARED if s.part and s.since > 1},
    }


FIELD_VERSIONS = _field_versions()  # derived, never written: the history above and the declaration's rows
SCHEMA_VERSION = max([*SCHEMA_HISTORY, *FIELD_VERSIONS.values()])
# The record's parts whose later fields an older record reads as unknown (None).
_PARTS = ("settings", *dict.fromkeys(s.part for s in declared.DECLARED if s.part))


# In-process engines run our decode loops; "llama-server" runs llama.cpp's own server as a
# subprocess, "openai" any OpenAI-compatible server (MTPLX, OptiQ, oMLX, mlx_lm.server, ...):
# the systems people actually run, measured as a streaming client.
ENGINES, IN_PROCESS_ENGINES, SERVER_ENGINES = declared.ENGINES, declared.IN_PROCESS, declared.SERVERS
# Methods whose decode loop is ours, so every round is accounted for. ngram-mod and
# ngram-map-k4v are llama.cpp's n-gram drafters (common/ngram-mod.cpp, common/ngram-map.cpp)
# run in our loops.
METHODS = ("baseline", "draft", "ngram", "mtp", "ngram-mod", "ngram-map-k4v")
# The same methods run by the library's own generation path (mlx_lm.stream_generate,
# llama-cpp-python's Llama.generate): controls that show what our loop costs or saves. They
# report tokens and times but no rounds; their prefill is the time to their first token.
REFERENCE_METHODS = ("ref-baseline", "ref-draft", "ref-ngram")
# llama-server's --spec-type values in the llama.cpp that the locked llama-cpp-python vendors;
# an arm's method is "baseline" or one of these, or a comma list of them as llama.cpp accepts.
SERVER_SPEC_TYPES = (
    "draft-simple",
    "draft-mtp",
    "draft-eagle3",
    "draft-dflash",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
)
# What an OpenAI-compatible server is told to do by its arm's command (the label, not our loop).
OPENAI_METHODS = ("baseline", "mtp", "draft", "ngram")
SPECULATIVE_METHODS = (
    "draft",
    "ngram",
    "mtp",
    "ngram-mod",
    "ngram-map-k4v",
    "ref-draft",
    "ref-ngram",
    *SERVER_SPEC_TYPES,
)
# Not a generation method: the job step that times target forward passes of 1..M query rows;
# its runs carry this method name and are never speedups.
VERIFY_COST = "verify-cost"
# The longest draft: llama.cpp's n-gram drafters propose up to 64 tokens (ngram-mod's n_max).
MAX_DEPTH = 64
# What each engine accepts, kept here so that the coordinator can check a sweep without
# importing mlx or llama.cpp. llama-server also takes comma lists of its types (is_method).
ENGINE_METHODS = {
    "mlx": ("baseline", "draft", "ngram", "mtp", "ngram-mod", "ngram-map-k4v", "ref-baseline", "ref-draft"),
    "llama.cpp": ("baseline", "draft", "ngram", "mtp", "ngram-mod", "ngram-map-k4v", "ref-baseline", "ref-ngram"),
    "llama-server": ("baseline", *SERVER_SPEC_TYPES),
    "openai": OPENAI_METHODS,
}


def is_method(engine: str, method: str) -> bool:
    """Whether `engine` runs `method`: one of ENGINE_METHODS[engine], or for llama-server a comma
    list of distinct --spec-type values ("draft-mtp,ngram-mod")."""
    known = ENGINE_METHODS.get(engine, ())
    if method in known:
        return True
    parts = method.split(",")
    return (
        engine == "llama-server"
        and len(parts) > 1
        and len(set(parts)) == len(parts)
        and all(p in SERVER_SPEC_TYPES for p in parts)
    )


def is_speculative(method: str) -> bool:
    return method in SPECULATIVE_METHODS or (method.count(",") > 0 and method.split(",")[0] in SERVER_SPEC_TYPES)


def least_depth(engine: str, method: str) -> int:
    """The shortest depth a speculative run records: 1, or 0 for llama-server's model-drafted types
    (`--spec-draft-n-max 0`, the drafter loaded: an arm of its own, never the baseline)."""
    return 0 if engine == "llama-server" and all(t.startswith("draft-") for t in method.split(",")) else 1


# Engines whose speculative loops draw one random number per emitted token, as their baseline
# does: with the same seed a sampled speculative run must emit the baseline's tokens exactly, so
# losslessness is checked on sampled runs too. MLX's loops share one key and cannot be checked.
SAME_SEED_REPRODUCIBLE = ("llama.cpp",)
PROMPT_CATEGORIES = ("conversation", "translation", "summarisation", "qa", "math", "rag", "code")

LOSSLESS_CHECKS = ("", "greedy reference", "same-seed baseline", "not checkable")
DIVERGENCES = ("none", "near-tie", "defect")  # or None: not checked
TEXT_SAMPLE_CHARS = 512
INTERLEAVINGS = ("", "rotated", "blocks")
MAX_ID_CHARS = 128
MAX_TEXT_CHARS = 4096
MAX_TOKENS = 10_000_000
MAX_SECONDS = 7 * 86400.0
MAX_TOKENS_PER_SECOND = 10_000_000.0
MAX_BYTES = 2**50
MAX_LIST = 1024
MAX_POWER_MODE_CHARS = 32
# Compute backends a run can record: llama.cpp's ggml backends, MLX's devices.
BACKENDS = ("", "cpu", "cuda", "metal")
# Energy counters: NVIDIA's NVML total-energy counter, Linux RAPL (/sys/class/powercap), and
# macOS IOReport's energy channels.
ENERGY_SOURCES = ("", "nvml", "rapl", "ioreport")


# A model class's suffix that the two formats disagree on: MLX's config names the class
# ("Qwen3_5ForCausalLM"), GGUF the architecture ("qwen35").
ARCHITECTURE_SUFFIX = r"(For[A-Z][A-Za-z0-9_]*|Model)$"


def architecture_family(name: str) -> str:
    """One spelling of an architecture for both formats: "LlamaForCausalLM" and "llama" ->
    "llama", "Qwen3_5ForCausalLM" and "qwen35" -> "qwen35"."""
    return re.sub(r"[^a-z0-9]", "", re.sub(ARCHITECTURE_SUFFIX, "", str(name)).lower())


class InvalidRecord(ValueError):
    """A record or spec that fails validation; the message names every faulty field (`problems`)."""

    problems: list[str] = []


class NewerSchema(InvalidRecord):
    """A record of a schema newer than this code reads: not faulty, but to be held (never parked)
    until the reader is upgraded."""

    def __init__(self, schema: int):
        self.schema = schema
        super().__init__(f"schema: record schema {schema} is newer than {SCHEMA_VERSION}, the newest this code reads")


# ---------------------------------------------------------------- field types (specfleet/schemas.py)

Id = Annotated[Str, text(1, MAX_ID_CHARS)]
Text = Annotated[Str, text(0, MAX_TEXT_CHARS)]
Tokens = Annotated[Int, between(0, MAX_TOKENS)]
Seconds = Annotated[Float, between(0, MAX_SECONDS)]
Rate = Annotated[Float, between(0, MAX_TOKENS_PER_SECOND)]
Joules = Annotated[Float, between(0.0, 1e9)]
Bytes = Annotated[Int, between(0, MAX_BYTES)]
ModelText = Annotated[Str, text(0, MAX_ID_CHARS * 2)]
Listed = Field(max_length=MAX_LIST)  # a list field's length: at most MAX_LIST items


def _known_method(method: str) -> str:
    if method != VERIFY_COST and not any(is_method(engine, method) for engine in ENGINES):
        refuse("choice", f" {method[:80]!r} is unknown to every engine (known: {', '.join(_ALL_METHODS)})")
    return method


_ALL_METHODS = tuple(dict.fromkeys(m for methods in ENGINE_METHODS.values() for m in methods))
Method = Annotated[Str, AfterValidator(_known_method)]


# ---------------------------------------------------------------- parts


def _sampler_class():
    """Sampler, generated from the declaration's sampler rows (specfleet/settings.py SAMPLER): one
    field each, its bounds pydantic's; a field added after the first schema may be None (unknown,
    in an older record)."""
    namespace = {
        "__doc__": "The sampler a run used (specfleet/settings.py SAMPLER). greedy: temperature 0.",
        "__module__": __name__,
        "__annotations__": {s.key: setting_type(s, optional=s.since > 1) for s in declared.SAMPLER},
        **{s.key: s.default for s in declared.SAMPLER},
        "greedy": property(lambda self: self.temperature == 0.0),
        "label": declared.sampler_label,
    }
    return model(InvalidRecord, "sampler")(type("Sampler", (), namespace))


Sampler = _sampler_class()


@model(InvalidRecord, "model identity")
class ModelIdentity:
    """A model as the weights describe it, never by where it lies on one machine.

    reference: a Hugging Face repo id ("org/name") or the file or directory name; revision: the
    hub commit when known. digest: SHA-256 over the files' own SHA-256s (agent/models.py).
    quantisation: GGUF file type ("Q8_0", "F16", ...) or MLX "4bit-g64", else the dtype ("bf16").
    Unknown numbers are 0 and unknown text is empty: never guessed."""

    reference: ModelText = ""
    revision: ModelText = ""
    digest: Annotated[Sha256, text(0, MAX_ID_CHARS * 2)] = ""
    architecture: ModelText = ""
    parameters: Bytes = 0
    quantisation: ModelText = ""
    tensor_types: ModelText = ""  # "F32:12,Q8_0:40": tensor count per type
    vocab_size: Bytes = 0
    context_length: Bytes = 0
    has_mtp: Bool = False
    bytes: Bytes = 0
    source: ModelText = ""  # "local" | "huggingface"

    def short(self) -> str:
        return f"{self.reference}@{self.digest[:12]}" if self.reference else ""


@model(InvalidRecord, "environment")
class Environment:
    """One reading of the machine around a run; None where the reading is not available here."""

    thermal: Str | None = None  # "nominal" | "throttled: ..." | ...: pmset's CPU limit
    # macOS thermald's pressure level, the one it throttles the whole SoC (GPU included) by:
    # "nominal" | "moderate" | "heavy" | "trapping" | "sleeping" (record schema 7)
    thermal_pressure: Str | None = None
    power_source: Str | None = None  # "ac" | "battery" | "ups"
    low_power_mode: Bool | None = None
    loadavg_1m: Float | None = None
    memory_available_bytes: Int | None = None
    swap_used_bytes: Int | None = None


def _model_paths(r: RunRecord) -> str:
    return "; ".join(
        f"{role}.reference {m.reference[:80]!r} is a path: a model is named by its file name"
        for role in ("target", "draft")
        if "/" in (m := getattr(r, role)).reference and m.source != "huggingface"
    )


def _method_of_engine(r: RunRecord) -> str:
    if r.method != VERIFY_COST and not is_method(r.engine, r.method):
        return f"method {r.method!r} is unknown to engine {r.engine!r}"
    if r.method != VERIFY_COST and is_speculative(r.method):
        if not least_depth(r.engine, r.method) <= r.depth <= MAX_DEPTH:
            return f"depth = {r.depth!r} is not in [{least_depth(r.engine, r.method)}, {MAX_DEPTH}]"
    elif r.depth != 0:
        return f"depth of {r.method} must be 0, got {r.depth!r}"
    return ""


def _system_of_engine(r: RunRecord) -> str:
    if r.engine in IN_PROCESS_ENGINES and r.system != "specfleet":
        return f"system of an in-process {r.engine} run is 'specfleet', got {r.system!r}"
    if r.engine == "llama-server" and r.system != "llama-server":
        return f"system of a llama-server run is 'llama-server', got {r.system!r}"
    return ""


# The rules between a record's fields, each judged on the fields it reads when they are sound
# (their own types and bounds are their annotations): a problem, or "".
RULES = (
    _model_paths,
    lambda r: "" if r.target.reference else "target.reference is required",
    lambda r: (
        "energy_joules and energy_source go together: both set or neither"
        if (r.energy_joules is None) != (r.energy_source == "")
        else ""
    ),
    lambda r: (
        "energy_cpu/gpu/ane/dram_joules are IOReport's split: energy_source 'ioreport' only"
        if any(getattr(r, f"energy_{p}_joules") is not None for p in ("cpu", "gpu", "ane", "dram"))
        and r.energy_source != "ioreport"
        else ""
    ),
    _method_of_engine,
    lambda r: (
        f"prompt_category {r.prompt_category!r} is not one of {', '.join(PROMPT_CATEGORIES)}"
        if r.prompt_category not in PROMPT_CATEGORIES and r.method != VERIFY_COST
        else ""
    ),
    lambda r: (
        f"tokens_accepted ({r.tokens_accepted}) exceeds tokens_drafted ({r.tokens_drafted})"
        if r.tokens_accepted > r.tokens_drafted
        else ""
    ),
    lambda r: (
        "drafted_by_position and acceptance_by_position differ in length"
        if r.drafted_by_position and len(r.drafted_by_position) != len(r.acceptance_by_position)
        else ""
    ),
    lambda r: (
        "acceptance_by_position holds a share outside [0, 1]"
        if any(not 0 <= a <= 1 for a in r.acceptance_by_position)
        else ""
    ),
    lambda r: (
        "a verify-cost run needs verify_cost_seconds" if r.method == VERIFY_COST and not r.verify_cost_seconds else ""
    ),
    lambda r: (
        f"verify_cost_seconds belongs to verify-cost runs, not {r.method}"
        if r.method != VERIFY_COST and r.verify_cost_seconds
        else ""
    ),
    lambda r: (
        "a run that diverged at a near-tie has lossless None (neither lossless nor a defect)"
        if r.divergence == "near-tie" and r.lossless is not None
        else ""
    ),
    lambda r: (
        "a run whose divergence is a defect has lossless false"
        if r.divergence == "defect" and r.lossless is not False
        else ""
    ),
    _system_of_engine,
)


# ---------------------------------------------------------------- the run record


@model(InvalidRecord, "invalid run record", RULES)
class RunRecord:
    """One measured generation (one arm, prompt and repeat of a job), or one verify-cost curve.
    Its constructor checks every field's type and bounds (the annotations: specfleet/schemas.py)
    and the rules between fields (`RULES`), naming every faulty one in one InvalidRecord."""

    run_id: Id
    job_id: Id
    attempt: Tokens
    engine: setting_type(declared.BY_NAME["engine"], optional=False)
    engine_version: Text  # every library version of the engine, "k=v k=v", sorted
    method: Method  # known to some engine; RULES: known to this one
    depth: Int  # draft depth K; 0 for baseline and verify-cost
    target: ModelIdentity
    sampler: Sampler
    prompt_set: Id
    prompt_set_digest: Sha256  # SHA-256 of the set's prompts and of the context documents
    prompt_category: Str
    prompt_id: Id
    context_tokens: Tokens  # tokens of distinct documents before the prompt (llama-bench -d)
    max_new_tokens: Tokens
    repeat: Tokens
    position: Annotated[Int, between(0, 1000)]  # order of this arm inside its repeat
    prompt_tokens: Tokens  # all tokens prefilled: context and prompt
    generated_tokens: Tokens
    prefill_seconds: Seconds
    ttft_seconds: Seconds
    decode_seconds: Seconds
    wall_seconds: Seconds
    decode_tokens_per_second: Rate
    prefill_tokens_per_second: Rate
    peak_memory_bytes: Bytes
    output_sha256: Sha256
    started_at_unix_seconds: Annotated[Float, between(0, 2**33)]
    draft: ModelIdentity = ModelIdentity()
    lossless: Bool | None = None  # output equal to the reference's (lossless_check); None: not checked
    # "greedy reference" | "same-seed baseline" | "not checkable"
    lossless_check: Annotated[Str, one_of(LOSSLESS_CHECKS)] = ""
    # The seed this run sampled with: derived from the sweep's, the repeat and the prompt.
    run_seed: Annotated[Int, between(0, 2**32 - 1)] = 0
    # Gaps between token arrivals as a streaming client sees them: a speculative round's tokens
    # arrive together, so its burst is one arrival (no zero gaps).
    inter_token_latency_p50_seconds: Seconds | None = None
    inter_token_latency_p90_seconds: Seconds | None = None
    inter_token_latency_p99_seconds: Seconds | None = None
    round_latency_p50_seconds: Seconds | None = None  # draft + verify time of one round
    round_latency_p90_seconds: Seconds | None = None
    rounds: Tokens = 0
    tokens_drafted: Tokens = 0
    tokens_accepted: Tokens = 0
    draft_seconds: Seconds = 0.0
    verify_seconds: Seconds = 0.0
    drafted_by_position: Annotated[tuple[Tokens, ...], Listed] = ()  # proposals at draft position 1, 2, ...
    acceptance_by_position: Annotated[tuple[Float, ...], Listed] = ()  # share of them accepted (0..1)
    acceptance_collapsed: Bool | None = None  # None: not a model-drafted method
    acceptance_reason: Text = ""
    verify_cost_seconds: Annotated[tuple[Seconds, ...], Listed] = ()  # verify-cost runs: T(M) for M = 1, 2, ...
    warmup_runs: Tokens = 0  # unmeasured runs of this arm before its first measured one on this prompt
    arm_order: Str = ""  # how arms were ordered: "williams" | "single"
    load_seconds: Seconds = 0.0
    cooldown_seconds: Seconds = 0.0
    env_before: Environment = Environment()
    env_after: Environment = Environment()
    env_nominal: Bool | None = None  # None: readings unavailable, so unknown
    env_reasons: Annotated[tuple[Text, ...], Listed] = ()
    # The system under test: "specfleet" (our loops, in process), "llama-server", or the name of
    # the OpenAI-compatible server an `openai` run measured ("MTPLX", "OptiQ", "oMLX", ...).
    system: Id = "specfleet"
    server_version: Text = ""  # the server's own --version: build number and commit
    server_command: Text = ""  # the server's full command line, as started (shell-quoted)
    # The server's own figures for the run (llama-server's `timings`), beside the client's.
    server_decode_tokens_per_second: Rate | None = None
    server_prefill_seconds: Seconds | None = None
    timings_disagree: Bool | None = None  # client and server decode tok/s differ by more than 5%
    # Drafters that keep state across requests (ngram-mod's table, ngram-cache): False when the
    # run started from a fresh server, True when it inherited state; None for stateless drafters.
    drafter_warm: Bool | None = None
    # Server arms: "rotated" (all servers up) | "blocks" (one at a time).
    interleaving: Annotated[Str, one_of(INTERLEAVINGS)] = ""
    # The accelerator (migration 005): the compute backend the engine ran on (BACKENDS; "" where
    # the engine cannot tell, as for a server), and the energy the run's generation drew, from the
    # counter named by energy_source (ENERGY_SOURCES; "" and None where none is readable here).
    backend: Annotated[Str, one_of(BACKENDS)] = ""
    energy_source: Annotated[Str, one_of(ENERGY_SOURCES)] = ""
    energy_joules: Joules | None = None
    joules_per_token: Joules | None = None  # energy_joules / generated_tokens
    # macOS (energy_source "ioreport"): the parts energy_joules sums, CPU, GPU, Neural Engine and
    # DRAM; None where the counter does not report a part (and on NVML and RAPL runs).
    energy_cpu_joules: Joules | None = None
    energy_gpu_joules: Joules | None = None
    energy_ane_joules: Joules | None = None
    energy_dram_joules: Joules | None = None
    # The energy mode the run started in: macOS "automatic" | "low" | "high" (pmset powermode),
    # Linux the ACPI platform profile ("balanced"); None where it cannot be read. A checked key:
    # the same Mac can decode 2.5-3x faster in High Power than in Automatic.
    power_mode: Annotated[Str, text(1, MAX_POWER_MODE_CHARS)] | None = None
    # Every declared setting (specfleet/settings.py), one column each; None where it does not
    # apply to the engine or was not recorded (records older than schema 3).
    settings: SettingsField = Settings()
    # Where the output first differs from the lossless check's reference (schema 4): DIVERGENCES
    # (None not checked, "none", "near-tie": the target's top two tokens there are closer than
    # divergence_threshold, so batch numerics may flip them and the run still counts, lossless
    # None; "defect": a clear margin or none known, lossless false), the generated-token index,
    # the run's and the reference's token, the target's logit margin between them there (one-token
    # decoding) and the threshold it was judged by.
    divergence: Annotated[Str, one_of(DIVERGENCES)] | None = None
    divergence_position: Tokens | None = None
    divergence_token: Tokens | None = None
    divergence_reference_token: Tokens | None = None
    divergence_margin: Joules | None = None
    divergence_threshold: Joules | None = None
    # Why a greedy divergence's margin is unknown, so that it is a defect without one (schema 9):
    # the engine's own refusal ("llama-server: token(s) [7] not among the top 20 at position 88"),
    # or that the engine reads no logits; "" where the margin was measured; None where none was
    # asked for (no divergence, a sampled check, one output longer than the other).
    divergence_cause: Text | None = None
    # Why this arm's drafter cannot draft within max_new_tokens at its settings ("" when it can;
    # None: not judged, as before schema 4).
    drafter_warning: Text | None = None
    # The start of the decoded output (at most TEXT_SAMPLE_CHARS), on a prompt's first repeat of
    # each arm and on every run that diverged: what a hash cannot show (a model that loops).
    # None where no sample was taken.
    text_sample: Annotated[Str, text(0, TEXT_SAMPLE_CHARS)] | None = None
    schema: Int = SCHEMA_VERSION

    # -------------------------------------------------------- serialisation

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """The record from its dict, upgraded from an older schema; InvalidRecord naming every
        unknown, missing or mistyped field, NewerSchema for a record of a newer schema."""
        if not isinstance(data, dict):
            raise InvalidRecord("record: must be a mapping")
        upgraded, problems = _upgrade(data, _schema_of(data))
        try:
            record = cls(**upgraded)
        except InvalidRecord as e:
            problems += e.problems or [str(e)]
        if problems:
            raise InvalidRecord("invalid run record: " + "; ".join(problems))
        return record

    @classmethod
    def from_json(cls, text: str | bytes) -> RunRecord:
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidRecord(f"run record is not JSON: {e}") from None
        return cls.from_dict(data)

    @classmethod
    def columns(cls) -> list[str]:
        """Store and export columns: one per leaf field, nested parts as `<part>_<field>`."""
        return list(_flatten(cls, None).keys())

    def row(self) -> dict[str, Any]:
        """Column -> value, in `columns()` order; tuples become lists (DuckDB LIST columns)."""
        return _flatten(type(self), self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RunRecord:
        """The record from a stored row (`row()`'s inverse); extra columns are ignored."""
        return cls.from_dict(_unflatten(cls, row, ""))


@functools.cache
def _fields(cls) -> tuple[tuple[str, Any], ...]:
    """(name, type) of a dataclass's fields, resolved once per class."""
    hints = get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


def _nested(tp) -> type | None:
    """The dataclass a field holds (ModelIdentity, Sampler, Environment), or None."""
    return tp if dataclasses.is_dataclass(tp) else None


def _part_prefix(prefix: str, name: str) -> str:
    """Column prefix of a nested part: `<part>_`, except the settings part, whose columns are the
    declared settings' own names."""
    return prefix if name == "settings" else f"{prefix}{name}_"


def _flatten(cls, value, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, tp in _fields(cls):
        v = getattr(value, name) if value is not None else None
        if _nested(tp):
            out.update(_flatten(tp, v, _part_prefix(prefix, name)))
        else:
            out[f"{prefix}{name}"] = list(v) if isinstance(v, tuple) else v
    return out


def _unflatten(cls, row: dict[str, Any], prefix: str) -> dict[str, Any]:
    out = {}
    for name, tp in _fields(cls):
        if _nested(tp):
            out[name] = _unflatten(tp, row, _part_prefix(prefix, name))
        elif f"{prefix}{name}" in row:
            out[name] = row[f"{prefix}{name}"]
    return out


def _schema_of(data: dict[str, Any]) -> int:
    """The record's schema version: required, at most SCHEMA_VERSION (NewerSchema otherwise)."""
    schema = data.get("schema")
    if schema is None:
        raise InvalidRecord(f"schema: is required (the record's schema version, {SCHEMA_VERSION} for this code)")
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        raise InvalidRecord(f"schema: must be a positive integer, got {schema!r}")
    if schema > SCHEMA_VERSION:
        raise NewerSchema(schema)
    return schema


def _upgrade(data: dict[str, Any], schema: int) -> tuple[dict[str, Any], list[str]]:
    """A record of an older schema in the current one's shape, the fields it predates unknown
    (FIELD_VERSIONS), and a problem for each such field it holds all the same."""
    if schema == SCHEMA_VERSION:
        return data, []

    def known(value) -> bool:
        return value is not None and (not isinstance(value, dict) or any(v is not None for v in value.values()))

    parts = {part: dict(data[part]) for part in _PARTS if isinstance(data.get(part), dict)}
    parts.setdefault("settings", {})
    problems = []
    for path, since in FIELD_VERSIONS.items():
        if since <= schema:
            continue
        part, _, key = path.rpartition(".")
        if part and part in parts:
            if parts[part].get(key) is not None:
                problems.append(f"{path}: unknown field in a schema {schema} record")
            parts[part][key] = None
        elif not part and known(data.get(path)):
            problems.append(f"{path}: unknown field in a schema {schema} record")
    return dict(data, schema=SCHEMA_VERSION, **parts), problems


# ---------------------------------------------------------------- the job spec


@model(InvalidRecord, "arm")
class Arm:
    """One arm of a cell. In-process engines: a method and depth. Server engines: a server
    configuration, the method being llama-server's --spec-type (or a label of what an OpenAI
    server's command does), `flags` the arm's own server flags (the type's parameters), and for
    `openai` the arm's command template ({model}, {depth}, {port})."""

    method: Str
    depth: Int = 0
    flags: tuple[Str, ...] = ()
    command: Str = ""
    build: str = ""  # llama-server: the build a sweep pins it to ("b9500"); a job's cell carries it in ServerSpec


@model(InvalidRecord, "server")
class ServerSpec:
    """What every server arm of a cell shares: free flags (`-fa on -c 65536 --parallel 1`), for
    `openai` the system's name and either the baseline's command template or the loopback URL
    of a server that is already running."""

    flags: tuple[Str, ...] = ()
    system: Str = ""
    command: Str = ""
    url: Str = ""
    build: str = ""  # llama-server: the build every arm runs ("b9500", specfleet/server_arms.py); "": the agent's own


@model(InvalidRecord, "prompt")
class Prompt:
    id: Str
    text: Str


@model(InvalidRecord, "verify_cost")
class VerifyCost:
    context_tokens: tuple[Int, ...] = (256,)
    max_rows: Int = 16
    repeats: Int = 5


@model(InvalidRecord, "job spec")
@declared.with_fields(declared.JOB_SPEC_FIELDS, lambda s: STRICT[s.type])
class JobSpec:
    """One cell of a sweep, as the coordinator hands it to an agent: what the worker runs.

    `model` maps "target" (and "draft") to the reference the sweep named; the agent replaces
    them with local paths before the worker starts (`with_models`). Defaults live here only."""

    engine: Str
    model: dict[Str, Str]
    prompt_set: Str
    prompt_category: Str
    prompt_set_digest: Str
    prompts: tuple[Prompt, ...]
    arms: tuple[Arm, ...]
    documents: tuple[Str, ...] = ()  # context documents, in order, for context_tokens > 0
    context_tokens: Int = 0
    sampler: Sampler = Sampler()
    memory_gb: Float = 0.0  # memory the agent needs for this engine's models; 0: no figure
    # The cell's declared settings (specfleet/settings.py) as the sweep chose them; the agent
    # resolves what it must (threads 0: its own default) before the engine gets them.
    settings: SettingsField = Settings()
    verify_cost: VerifyCost | None = None
    server: ServerSpec | None = None  # server engines only
    # Then the job's own parameters (specfleet/settings.py JOB_SPEC_FIELDS: max_new_tokens, warmup, repeats,
    # deadline_seconds, cooldown_seconds), fields generated from their rows (`with_fields`): each its row's
    # strict type and default. Their bounds are checked where a sweep is read (specfleet/sweeps.py JobFields),
    # the engines' max_new_tokens by its row again (agent/engines/base.py validate); a spec carries what the
    # coordinator wrote (a test's job may take a deadline shorter than a sweep file allows).

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        """The spec from its JSON (older specs' top-level drafter parameters read into `settings`,
        their `warmup_cap` as `warmup`); InvalidRecord naming every faulty field."""
        try:
            data = json.loads(text)
        except ValueError as e:
            raise InvalidRecord(f"job spec is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise InvalidRecord("job spec: must be a mapping")
        if "warmup_cap" in data and "warmup" not in data:  # specs written before the field took the sweep's name
            data["warmup"] = data.pop("warmup_cap")
        legacy = {new: data.pop(old) for old, new in _SPEC_KEYS_BEFORE_SETTINGS.items() if old in data}
        if legacy:
            data["settings"] = {**legacy, **(data.get("settings") or {})}
        return cls(**data)

    def with_models(self, **paths: str) -> JobSpec:
        return dataclasses.replace(self, model={**self.model, **paths})


# Job specs of schema 2 carried the n-gram drafters' parameters at their top level.
_SPEC_KEYS_BEFORE_SETTINGS = {
    "ngram_min": "ngram_n_min",
    "ngram_max": "ngram_n_max",
    "ngram_mod_n_match": "ngram_mod_n_match",
    "ngram_mod_n_min": "ngram_mod_n_min",
    "ngram_map_size_n": "ngram_map_size_n",
    "ngram_map_min_hits": "ngram_map_min_hits",
}


# ---------------------------------------------------------------- comparability

# The run record's columns that must be equal for two runs to be pooled in one comparison
# (pyperf's _CHECKED_METADATA): the declaration's checked settings. Chip and machine are not
# here: they are what a comparison puts side by side.
CHECKED_KEYS = declared.CHECKED


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The checked keys on which two runs (rows, or RunRecord.row()) differ: [] when they may
    be pooled."""
    return [k for k in CHECKED_KEYS if a.get(k) != b.get(k)]
