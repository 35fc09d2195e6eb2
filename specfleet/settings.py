"""Every setting that can change a measurement, and every key of a sweep file, declared once.

A `Setting` says what a setting is (type, bounds or choices, default), where its value comes from
(`source`: a sweep field, the job's own parameter, a llama-server arm's parameter, the server's
command line, measured by the agent, or a field of the run record), and what the fleet does with it:
whether runs record it, whether it is a checked key (two runs pool only when equal on every one),
whether a claim may select on it, and how pages and metrics name it.

Derived from `DECLARED`, never listed again by hand:
- the one checker: each row's pydantic annotation (specfleet/schemas.py `setting_type`: its strict
  type, its choices a Literal, its bounds pydantic's own Field(ge, le)), used by the sweep file, the
  job spec, the record and the engines alike;
- the sweep file: its declared settings (`parse_settings`: a scalar or a list, a dimension of the
  matrix), its `samplers` entries (`SamplerFields`), the job's own fields (`JobFields`: max_new_tokens,
  warmup, repeats, ...), a llama-server arm's `params` (`ARM_PARAMS`, `TYPE_PARAMS`), and its
  reference page docs/sweeps.md (specfleet/sweep_reference.py);
- `Settings`, the one frozen record of a cell's settings that the job spec, the engines' request and
  the run record carry (its fields are record and store columns of the same names); the record's
  `Sampler` (`SAMPLER`); the job spec's defaults;
- the engines' knobs: a setting's llama-server flags and llama.cpp context parameters
  (`server_argv`, `llama_cparams`), and the sampler as each engine applies it (llama.cpp's chain
  `sampler_chain`, a server's request `sampler_request`, mlx-lm's `sampler_keywords`); free server
  flags that a setting owns are refused in a sweep, naming the setting;
- the record's schema history for the declared fields (each row's `since`; specfleet/record.py
  SCHEMA_HISTORY holds the record's own fields);
- `CHECKED_KEYS` (specfleet/record.py), the claims' condition keys, the `/metrics` group info
  labels, the sampler's label (`sampler_label`, `sampler_label_sql`) and the dashboard's group label
  (`describe`).

Adding a setting: a row here (its `since` the next record schema, which moves SCHEMA_VERSION), a
numbered store migration adding its column, docs/sweeps.md regenerated, and (only if it needs one)
the page that draws it. Settings that are the run record's own fields (`core`: sampler, models,
context, versions, ...) are declared by their store column; their values stay where the record
keeps them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# Where a setting's value comes from.
SWEEP = "sweep"  # a sweep file field (scalar, or a list: a dimension of the matrix)
JOB = "job"  # a sweep file field the job spec carries as its own (max_new_tokens, warmup, repeats, ...)
ARM = "arm"  # a llama-server arm's parameter (arms[].params.<key>): a flag of the arm that names its type
SERVER = "server"  # read from the server a run measured (its command line, its --version)
MEASURED = "measured"  # read by the agent on the machine (backend, power mode, versions)
RECORD = "record"  # a field of the run record itself (sampler, models, prompts, context)

ENGINES = ("mlx", "llama.cpp", "llama-server", "openai")
IN_PROCESS = ("mlx", "llama.cpp")
LLAMA_CPP = ("llama.cpp", "llama-server")
SERVERS = ("llama-server", "openai")

# llama.cpp's KV-cache types (common/arg.cpp kv_cache_types), as -ctk/-ctv spell them; bf16 left
# out: llama-cpp-python names no GGML_TYPE_BF16 for the in-process engine.
# How prompts reach the model (setting prompt_format): "auto" in a sweep, resolved by the agent.
PROMPT_FORMATS = ("auto", "chat", "raw")
KV_CACHE_TYPES = ("f32", "f16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# How a server arm's runs are measured (setting server_state): servers kept up and warmed alike, or a
# server started for every measured run and warmed up after the start.
SERVER_STATES = ("warm", "fresh")
# llama-server's model-drafted --spec-types (specfleet/record.py SERVER_SPEC_TYPES).
DRAFT_TYPES = ("draft-simple", "draft-mtp", "draft-eagle3", "draft-dflash")
_ARM = dict(recorded=False, checked=False, engines=("llama-server",), since=2, core=True)  # an arm's flag, no column
# What a measured run's drafter had seen before it (setting drafter_start): "unseen", never the
# measured request (agent/protocol.py); runs recorded before schema 6 are unknown (None).
DRAFTER_STARTS = ("unseen",)


@dataclass(frozen=True)
class Setting:
    name: str  # the run record's and store's column; the job spec's and request's field
    type: type  # int | float | str | bool
    source: str  # SWEEP | JOB | ARM | SERVER | MEASURED | RECORD
    label: str  # how pages and metrics name it
    doc: str
    default: Any = None  # what a sweep that omits it gets; None: nothing set (unknown, or not applicable)
    # The sweep file's key, dotted ("ngram_mod.n_match"; "samplers[].top_p": a field of each list entry;
    # "arms[].params.n_match": a llama-server arm's parameter); "" when not a sweep field.
    sweep: str = ""
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    recorded: bool = True
    checked: bool = True  # runs differing in it are never pooled
    condition: bool = False  # a claim may select runs on it (`conditions.<name>`)
    engines: tuple[str, ...] = ENGINES  # the engines it applies to; the others record None
    since: int = 3  # the run record schema that added it (specfleet/record.py SCHEMA_VERSION)
    server_flags: tuple[str, ...] = ()  # llama-server flags that take its value ("-ctk", "-ctv")
    llama_cparams: tuple[str, ...] = ()  # llama_context_params fields it sets in-process
    llama_enum: str = ""  # the llama_cpp constant prefix its value names ("GGML_TYPE_" + "Q8_0")
    core: bool = False  # a field of the run record's own (sampler, models, ...), not carried in Settings
    unset: Any = None  # a value that leaves it to the engine or the agent (threads 0, top_k 0): no flag, no sampler
    part: str = ""  # the record's part it is a field of ("sampler": Sampler's field <name minus "sampler_">)
    spec_types: tuple[str, ...] = ()  # ARM: the llama-server --spec-type values it is a parameter of
    # SAMPLER rows (`engines`: those that apply it; a sweep or request that sets it for another is refused,
    # `sampler_problems`), how each engine applies the value: llama.cpp's llama_sampler_init_<llama_sampler>(value,
    # *llama_args) at place `chain` of the chain (in process); llama-server's `samplers` entry and the request's
    # JSON key (llama-server and OpenAI-compatible servers); the keyword of mlx-lm's make_sampler and of
    # llama-cpp-python's Llama.generate (the reference arms).
    llama_sampler: str = ""
    llama_args: tuple = ()
    chain: int = 0
    server_sampler: str = ""
    request_key: str = ""
    keyword: str = ""
    short: str = ""  # how a sampler label writes it ("T" of "T=0.7"); its label when ""
    spec_field: bool = True  # JOB rows: a field of the job spec, read by the worker; False: the sweep's own

    @property
    def key(self) -> str:
        """Its field in its record part (Sampler.top_p) or in Settings (its name)."""
        return self.name[len(self.part) + 1 :] if self.part else self.name


DECLARED: tuple[Setting, ...] = (
    # ---- the run record's own fields (their values stay where the record keeps them)
    Setting("target_digest", str, RECORD, "model", "The target weights' SHA-256", since=1, core=True),
    Setting("draft_digest", str, RECORD, "draft", "The draft weights' SHA-256", since=1, core=True),
    Setting("engine", str, RECORD, "engine", "The engine that ran it", choices=ENGINES, condition=True, since=1,
            core=True),
    Setting("engine_version", str, MEASURED, "engine version", "Every library version of the engine", since=1,
            core=True),
    Setting("system", str, RECORD, "system", "The system under test: specfleet, llama-server, or a server's name",
            condition=True, since=2, core=True),
    # The sampler (the record's Sampler part; a sweep's `samplers` entries), in the record's field order; each
    # engine applies every row from here (`chain`: llama.cpp's order, top-k before top-p, temperature last).
    Setting("sampler_temperature", float, RECORD, "temperature", "Sampling temperature (0: greedy)", default=0.0,
            sweep="samplers[].temperature", lo=0, hi=10, since=1, core=True, part="sampler", llama_sampler="temp",
            chain=8, server_sampler="temperature", request_key="temperature", keyword="temp", short="T"),
    Setting("sampler_top_p", float, RECORD, "top_p", "Nucleus truncation (1: none)", default=1.0, unset=1.0,
            sweep="samplers[].top_p", lo=0.0001, hi=1, since=1, core=True, part="sampler", llama_sampler="top_p",
            llama_args=(1,), chain=2, server_sampler="top_p", request_key="top_p", keyword="top_p"),
    Setting("sampler_top_k", int, RECORD, "top_k", "Top-k truncation (0: none)", default=0, unset=0,
            sweep="samplers[].top_k", lo=0, hi=1_000_000, since=1, core=True, part="sampler", llama_sampler="top_k",
            chain=1, server_sampler="top_k", request_key="top_k", keyword="top_k"),
    Setting("sampler_seed", int, RECORD, "seed",
            "The sweep's seed; a sampled run's own seed is derived from it, the repeat and the prompt", default=0,
            sweep="samplers[].seed", lo=0, hi=2**32 - 1, since=1, core=True, part="sampler", llama_sampler="dist",
            chain=9, request_key="seed"),
    Setting("sampler_min_p", float, RECORD, "min_p",
            "Min-p truncation: tokens less likely than min_p times the likeliest are cut (0: none; llama.cpp's "
            "--min-p, mlx-lm's min_p)", default=0.0, unset=0.0, sweep="samplers[].min_p", lo=0, hi=1, since=6,
            core=True, part="sampler", llama_sampler="min_p", llama_args=(1,), chain=3, server_sampler="min_p",
            request_key="min_p", keyword="min_p"),
    Setting("sampler_xtc_probability", float, RECORD, "xtc_probability",
            "XTC (exclude top choices): the chance at each token of cutting every token more likely than the "
            "threshold 0.1 but the least likely of them (0: off; llama.cpp's --xtc-probability, mlx-lm's "
            "xtc_probability)", default=0.0, unset=0.0, sweep="samplers[].xtc_probability", lo=0, hi=1, since=8,
            core=True, part="sampler", chain=4, server_sampler="xtc", request_key="xtc_probability", short="xtc",
            engines=("llama-server", "openai")),
    Setting("prompt_set_digest", str, RECORD, "prompts", "SHA-256 of the prompts and context documents read",
            since=1, core=True),
    Setting("context_tokens", int, RECORD, "context",
            "Tokens of distinct documents before the prompt (llama-bench -d); a list in a sweep: a dimension",
            default=0, sweep="context_tokens", lo=0, hi=131072, condition=True, since=1, core=True),
    Setting("max_new_tokens", int, JOB, "new tokens", "Tokens generated per run (end-of-generation banned)",
            default=128, sweep="max_new_tokens", lo=1, hi=16384, since=1, core=True),
    Setting("power_mode", str, MEASURED, "power mode", "macOS energy mode or Linux platform profile", since=2,
            core=True),
    Setting("backend", str, MEASURED, "backend", "The compute backend the engine ran on (cpu, cuda, metal)",
            condition=True, since=2, core=True),
    Setting("server_version", str, SERVER, "server version",
            "The server's own version: llama-server's build and commit, an OpenAI-compatible server's --version "
            "or package version", engines=SERVERS, since=2, core=True),
    # ---- this round's settings: carried in Settings, one record column each
    Setting("ngram_n_min", int, SWEEP, "ngram n_min", "Prompt lookup: shortest suffix matched", default=1,
            sweep="ngram.n_min", lo=1, hi=16, engines=IN_PROCESS),
    Setting("ngram_n_max", int, SWEEP, "ngram n_max", "Prompt lookup: longest suffix matched", default=3,
            sweep="ngram.n_max", lo=1, hi=16, engines=IN_PROCESS),
    Setting("ngram_mod_n_match", int, SWEEP, "ngram-mod n_match", "ngram-mod: tokens hashed to look up the next",
            default=24, sweep="ngram_mod.n_match", lo=1, hi=1024, engines=IN_PROCESS),
    Setting("ngram_mod_n_min", int, SWEEP, "ngram-mod n_min", "ngram-mod: shortest draft worth proposing",
            default=48, sweep="ngram_mod.n_min", lo=0, hi=1024, engines=IN_PROCESS),
    Setting("ngram_map_size_n", int, SWEEP, "k4v size_n", "ngram-map-k4v: length of the key n-gram", default=12,
            sweep="ngram_map.size_n", lo=1, hi=1024, engines=IN_PROCESS),
    Setting("ngram_map_min_hits", int, SWEEP, "k4v min_hits", "ngram-map-k4v: hits before a value is proposed",
            default=1, sweep="ngram_map.min_hits", lo=1, hi=1024, engines=IN_PROCESS),
    Setting("threads", int, SWEEP, "threads",
            "llama.cpp's generation and batch threads (-t/-tb); 0 in a sweep: the agent's default. Runs record the "
            "count used", default=0, unset=0, sweep="threads", lo=0, hi=1024, condition=True, engines=LLAMA_CPP,
            server_flags=("-t", "-tb"), llama_cparams=("n_threads", "n_threads_batch")),
    Setting("kv_cache_type", str, SWEEP, "KV cache",
            "llama.cpp's K and V cache type (-ctk/-ctv; type_k/type_v in process)", default="f16",
            sweep="kv_cache_type", choices=KV_CACHE_TYPES, condition=True, engines=LLAMA_CPP, since=4,
            server_flags=("-ctk", "-ctv"), llama_cparams=("type_k", "type_v"), llama_enum="GGML_TYPE_"),
    Setting("server_state", str, SWEEP, "server state",
            "The state a server arm's runs are measured in, the same for a pair's baseline and arm: warm (every "
            "arm's server kept up across the job, each warmed up by the same number of requests before every pair) "
            "or fresh (every measured run on a server started for it, then warmed up by the prompt's warm-up count). "
            "Runs record the state they had: arms measured in blocks (servers that cannot stay up together) are "
            "always fresh", default="warm", sweep="server_state", choices=SERVER_STATES, condition=True,
            engines=("llama-server",), since=4),
    Setting("server_requests", int, SERVER, "server requests",
            "Requests the run's server had served before it (its warm-up included): equal for a pair's baseline "
            "and arm", lo=0, checked=False, engines=("llama-server",), since=4),
    Setting("warmup_converged", bool, MEASURED, "warm-up converged",
            "Whether the run's warm-up ended with two consecutive runs within 5% of each other (False: it reached "
            "the sweep's warm-up cap unsteady; None: no warm-up was asked)", checked=False, since=4),
    Setting("spec_draft_n_min", int, SWEEP, "draft n_min",
            "llama-server's shortest draft worth verifying (--spec-draft-n-min; llama.cpp's default 0)", default=0,
            unset=0, sweep="spec_draft.n_min", lo=0, hi=1024, condition=True, engines=("llama-server",), since=4,
            server_flags=("--spec-draft-n-min",)),
    Setting("prompt_format", str, SWEEP, "prompt format",
            "How a prompt reaches the model: chat (rendered through the model's chat template, its system prompt "
            "and reasoning switch: the GGUF's tokenizer.chat_template with jinja2 as llama.cpp does, the MLX "
            "tokenizer's apply_chat_template, /v1/chat/completions) or raw (the text as it is). auto in a sweep: "
            "chat where the model has a template, else raw. Runs record the format used", default="auto",
            unset="auto", sweep="prompt_format", choices=PROMPT_FORMATS, condition=True, since=4),
    Setting("system_prompt", str, SWEEP, "system prompt",
            "The system message of a chat prompt (\"\": none, the template's own default if it has one)",
            default="", sweep="system_prompt", since=4),
    Setting("reasoning", str, SWEEP, "reasoning",
            "A chat template's reasoning switch (enable_thinking) on or off; unset: the template's default. Runs "
            "record on or off where the template has a switch, else nothing", sweep="reasoning", choices=("on", "off"),
            condition=True, since=4),
    Setting("memory_gb", int, MEASURED, "memory",
            "The machine's memory in GiB, rounded (unified memory on a Mac: the \"24 GB\" of \"M4 Pro 24 GB\"), as "
            "the agent reads it. A claim condition, not a checked key: like the chip, it is what a comparison puts "
            "side by side", lo=1, hi=1 << 20, checked=False, condition=True, since=5),
    Setting("drafter_start", str, MEASURED, "drafter start",
            "What the drafter had seen before the measured run: unseen (made fresh for each generation, in process; "
            "or a server started for the run, or one whose drafter keeps no state across requests, warmed up on "
            "other text: never on the measured request). A checked key: runs whose drafter may have seen their "
            "request (recorded before schema 6, or a warm OpenAI-compatible server: unknown) never pool with these",
            choices=DRAFTER_STARTS, since=6),
    Setting("server_flags", str, SERVER, "server flags",
            "What every arm's server of a job shares, as flags: llama-server's (the sweep's and the declared "
            "settings'), an OpenAI-compatible server's baseline command without its binary, model paths, host and "
            "port; an arm's own flags are its method and depth",
            engines=SERVERS),
    # ---- the job's own parameters (the job spec's fields; not settings of a run's record)
    Setting("prompts", int, JOB, "prompts per set", "The first N prompts of each prompt set; unset: all",
            sweep="prompts", lo=1, hi=10_000, recorded=False, checked=False, since=1, core=True, spec_field=False),
    Setting("warmup", int, JOB, "warm-up cap",
            "Warm-up runs per arm and prompt before the measured ones, until two consecutive runs agree within 5%; "
            "at most this many (0: none)", default=10, sweep="warmup", lo=0, hi=20, recorded=False, checked=False,
            since=1, core=True),
    Setting("repeats", int, JOB, "repeats",
            "Measured runs per arm and prompt, rounded up to complete the arms' Williams design", default=3,
            sweep="repeats", lo=1, hi=1000, recorded=False, checked=False, since=1, core=True),
    Setting("max_attempts", int, JOB, "attempts", "Attempts of a job before it fails (a lease lost, a worker crashed)",
            default=3, sweep="max_attempts", lo=1, hi=20, recorded=False, checked=False, since=1, core=True,
            spec_field=False),
    Setting("deadline_seconds", float, JOB, "deadline", "Seconds a job may run before the agent stops it",
            default=3600.0, sweep="deadline_seconds", lo=10, hi=7 * 86400, recorded=False, checked=False, since=1,
            core=True),
    Setting("cooldown_seconds", float, JOB, "cool-down", "Rest before every measured run (thermal recovery)",
            default=0.0, sweep="cooldown_seconds", lo=0, hi=3600, checked=False, since=1, core=True),
    # ---- llama-server's spec-type parameters (arms[].params.<key>): flags of the arm that names the type,
    # bounded as llama.cpp's common/arg.cpp bounds them; unset: llama.cpp's default
    Setting("spec_draft_n_min_param", int, ARM, "draft n_min", "Shortest draft worth verifying",
            sweep="arms[].params.n_min", lo=0, hi=1024, spec_types=DRAFT_TYPES, server_flags=("--spec-draft-n-min",),
            **_ARM),
    Setting("spec_draft_p_min", float, ARM, "draft p_min", "Least probability of a drafted token (greedy drafts)",
            sweep="arms[].params.p_min", lo=0, hi=1, spec_types=DRAFT_TYPES, server_flags=("--spec-draft-p-min",),
            **_ARM),
    *(Setting(f"spec_{t.replace('-', '_')}_size_n", int, ARM, f"{t} size_n", "Length of the key n-gram looked up",
              sweep="arms[].params.size_n", lo=1, hi=1024, spec_types=(t,), server_flags=(f"--spec-{t}-size-n",),
              **_ARM) for t in ("ngram-simple", "ngram-map-k", "ngram-map-k4v")),
    *(Setting(f"spec_{t.replace('-', '_')}_min_hits", int, ARM, f"{t} min_hits",
              "Times a key must have been seen before its value is proposed", sweep="arms[].params.min_hits", lo=1,
              hi=1024, spec_types=(t,), server_flags=(f"--spec-{t}-min-hits",), **_ARM)
      for t in ("ngram-simple", "ngram-map-k", "ngram-map-k4v")),
    Setting("spec_ngram_mod_n_match", int, ARM, "ngram-mod n_match", "Tokens hashed to look up the next",
            sweep="arms[].params.n_match", lo=1, hi=1024, spec_types=("ngram-mod",),
            server_flags=("--spec-ngram-mod-n-match",), **_ARM),
    Setting("spec_ngram_mod_n_min", int, ARM, "ngram-mod n_min", "Shortest draft worth proposing",
            sweep="arms[].params.n_min", lo=0, hi=1024, spec_types=("ngram-mod",),
            server_flags=("--spec-ngram-mod-n-min",), **_ARM),
)  # fmt: skip

BY_NAME = {s.name: s for s in DECLARED}
assert len(BY_NAME) == len(DECLARED), "a setting is declared twice"

# The settings that Settings carries (every declared setting that is not a field of the record's own).
CARRIED = tuple(s for s in DECLARED if not s.core)
SWEEP_SETTINGS = tuple(s for s in CARRIED if s.sweep)  # Settings' fields a sweep sets: scalar or a dimension
SAMPLER = tuple(s for s in DECLARED if s.part == "sampler")  # Sampler's fields, in order
JOB_FIELDS = tuple(s for s in DECLARED if s.source == JOB)  # the job's own sweep fields (Sweep's)
JOB_SPEC_FIELDS = tuple(s for s in JOB_FIELDS if s.spec_field)  # those the job spec carries to the worker
ARM_PARAMS = tuple(s for s in DECLARED if s.source == ARM)
# Each llama-server --spec-type's own parameters: sweep key -> its flag.
TYPE_PARAMS = {
    t: {s.sweep.rpartition(".")[2]: s.server_flags[0] for s in ARM_PARAMS if t in s.spec_types}
    for t in dict.fromkeys(t for s in ARM_PARAMS for t in s.spec_types)
}
CHECKED = tuple(s.name for s in DECLARED if s.checked)
CONDITIONS = tuple(s for s in DECLARED if s.condition)
OWNED_SERVER_FLAGS = {flag: s for s in CARRIED for flag in s.server_flags}

Settings = dataclasses.make_dataclass(
    "Settings",
    [(s.name, s.type | None, dataclasses.field(default=s.default)) for s in CARRIED],
    frozen=True,
    namespace={
        "__doc__": "A cell's settings (specfleet/settings.py DECLARED): chosen by the sweep, resolved by the agent "
        "(threads), read from the server (flags); None where a setting is unknown or does not apply.",
    },
)


def with_fields(rows, annotation=lambda s: s.type | None):
    """A class decorator: each of `rows` added to the class as a field (its name, `annotation(row)`,
    the row's default) before dataclasses or pydantic read the class's annotations: the job's own
    parameters of Sweep and JobSpec, written once, here."""

    def add(cls):
        for s in rows:
            cls.__annotations__[s.name] = annotation(s)
            setattr(cls, s.name, s.default)
        return cls

    return add


def for_engine(settings, engine: str):
    """`settings` with None for every setting that does not apply to `engine` (what a run records)."""
    return dataclasses.replace(settings, **{s.name: None for s in CARRIED if engine not in s.engines})


def server_argv(settings) -> list[str]:
    """The llama-server flags the declared settings set (each flag followed by the value)."""
    argv = []
    for s in CARRIED:
        value = getattr(settings, s.name)
        if s.server_flags and value not in (None, s.unset) and "llama-server" in s.engines:
            for flag in s.server_flags:
                argv += [flag, str(value)]
    return argv


def llama_cparams(settings) -> dict[str, tuple[Any, str]]:
    """llama_context_params field -> (value, llama_cpp constant prefix or "") for the declared settings."""
    out = {}
    for s in CARRIED:
        value = getattr(settings, s.name)
        if s.llama_cparams and value not in (None, s.unset) and "llama.cpp" in s.engines:
            for field in s.llama_cparams:
                out[field] = (value, s.llama_enum)
    return out


def sampler_chain(sampler) -> list[tuple[Setting, Any]]:
    """(row, value) of the sampler's rows that llama.cpp chains (`llama_sampler`), in `chain`
    order, leaving out those at their `unset` value or unknown (None)."""
    rows = sorted((s for s in SAMPLER if s.llama_sampler), key=lambda s: s.chain)
    return [(s, v) for s in rows if (v := getattr(sampler, s.key)) is not None and v != s.unset]


def sampler_problems(sampler, engine: str) -> list[str]:
    """The sampler's rows set (other than unknown or their `unset`) that `engine` does not apply (a
    row's `engines`), as `<key>: applies to <engines> only, not <engine>`: a run must never record a
    sampler setting its engine ignored."""
    return [
        f"{s.key}: applies to {', '.join(s.engines)} only, not {engine}"
        for s in SAMPLER
        if engine not in s.engines and (v := getattr(sampler, s.key)) is not None and v != s.unset
    ]


def sampler_keywords(sampler) -> dict[str, Any]:
    """The sampler as mlx-lm's make_sampler and llama-cpp-python's Llama.generate take it (`keyword`),
    unknown values left out."""
    return {s.keyword: v for s in SAMPLER if s.keyword and (v := getattr(sampler, s.key)) is not None}


def sampler_request(sampler) -> dict[str, Any]:
    """The sampler as a server's JSON request names it (`request_key`), unknown values left out."""
    return {s.request_key: v for s in SAMPLER if s.request_key and (v := getattr(sampler, s.key)) is not None}


def sampler_label(sampler) -> str:
    """The sampler's label, "greedy" or "T=0.7 top_p=0.9": the temperature when it samples, then
    every other sampler field set to other than its default ("greedy top_k=20"); `sampler_label_sql`
    is the same in SQL."""
    first, *rest = SAMPLER
    temperature = getattr(sampler, first.key)
    out = f"{first.short}={temperature:g}" if temperature else "greedy"
    for s in rest:
        value = getattr(sampler, s.key)
        if value is not None and value != s.default:
            out += f" {s.short or s.label}={value:g}" if s.type is float else f" {s.short or s.label}={value}"
    return out


def sampler_label_sql(prefix: str = "") -> str:
    """SQL: `sampler_label` of a run's sampler columns (`prefix` qualifies them: "g.")."""
    first, *rest = SAMPLER
    shown = " || ".join(
        f"CASE WHEN {c} IS NOT NULL AND {c} != {s.default!r} THEN ' {s.short or s.label}=' || "
        + (f"printf('%g', {c})" if s.type is float else f"CAST({c} AS VARCHAR)")
        + " ELSE '' END"
        for s in rest
        for c in [f"{prefix}{s.name}"]
    )
    t = f"{prefix}{first.name}"
    return f"(CASE WHEN {t} != 0 THEN '{first.short}=' || printf('%g', {t}) ELSE 'greedy' END || {shown})"


def is_missing(value) -> bool:
    """Whether a value read back from a query is no value: None, NaN, pandas' NA or NaT, whatever
    dtype the column came back in (a column mixing set and NULL values comes back nullable, and
    pandas' NA has no truth value: `NA == 4` is NA, and `bool(NA)` raises)."""
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN and NaT differ from themselves
    except TypeError:  # pandas' NA: its comparisons are NA again
        return True


def shown_value(s: Setting, value) -> str:
    """A set value as labels write it: an integer setting read back as a float (a column that mixed
    NULLs) without its ".0"."""
    if s.type is int and isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def describe(values: dict[str, Any], shown: set[str] | frozenset[str] = frozenset()) -> str:
    """A comparable group's checked settings that a label does not show already (`shown`) and
    that are set to other than their default, as "threads 4 · power mode high": the part of the
    dashboard's group label that follows the declaration. Missing values (`is_missing`) are not
    shown, whatever dtype the caller's frame gave them."""
    parts = []
    for s in DECLARED:
        if not s.checked or s.name in shown:
            continue
        value = values.get(s.name)
        if is_missing(value) or value == "" or (s.default is not None and value == s.default):
            continue
        parts.append(f"{s.label} {shown_value(s, value)}")
    return " · ".join(parts)


def sql_type(s: Setting) -> str:
    return {int: "BIGINT", float: "DOUBLE", str: "VARCHAR", bool: "BOOLEAN"}[s.type]
