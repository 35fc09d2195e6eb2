"""Engine `llama-server`: llama.cpp's own server, run as people run it and measured as a client.

Each arm is one server configuration: `-m target` (`-md draft` for the types that take a draft
model), `--host 127.0.0.1 --port P --metrics`, the cell's shared flags (`-fa on -c 65536
--parallel 1 -ngl 99`), `--spec-type <method>` with the depth as that type's longest draft, then
the arm's own flags. A request is one streamed POST /completion of the prompt's token ids with
`cache_prompt: false` (every run prefills its whole prompt), `ignore_eos: true` (exactly
max_new_tokens tokens, as in our loops and llama-bench), `return_tokens: true` and the cell's
sampler. The client stamps every event as it arrives, and the event's `tokens_predicted` says how
many tokens have arrived by then. An event carries the id of its last token only: llama-server
holds a token back while its text is incomplete UTF-8 and sends it with the next one, text
joined but id dropped, so such tokens are UNKNOWN_ID (-1) in `Generation.tokens` (rare with real
text, frequent with the tiny test models' byte tokens); the rest are the real ids.

The server's final `timings` give its own decode speed, prefill time and draft counts; its
/metrics counters before and after the run give acceptance by draft position
(`llamacpp:spec_decode_num_accepted_tokens_per_pos_total`). llama-server counts no drafts by
position, so `drafted_by_position` is its own denominator for acceptance by position: the run's
verification steps (`spec_decode_num_drafts_total`) at every position, which counts a draft
shorter than a position as a miss there, as llama-server's log line "acc per pos" does. The
server's memory is not measured: `peak_memory_bytes` is 0.

Server state is the protocol's to set, the same for every arm (agent/protocol.py, setting
server_state): the engine never restarts a server on its own, except that in blocks mode starting
one arm's server stops the others. `restart(arm)` stops an arm's server so that its next request
starts a fresh one; `served(arm)` is the number of requests the arm's current server has served (0
when none is up), so a pair's baseline and arm can be measured after the same number. Drafters that
keep state across requests (ngram-mod's shared hash table, ngram-cache's context cache,
ngram-map-k's and ngram-map-k4v's key maps: common/speculative.cpp, common/ngram-map.cpp) record
whether their server had served a request before the run (`drafter_warm`); other types None.

`interleaving(arms)` decides whether all arms' servers stay up together ("rotated": runs rotate
through the arms) or only the current arm's ("blocks"), from agent/engines/server_memory.py.

What a run leaves besides its figures, as the in-process engines do: its text sample
(`detokenize`: the server's /detokenize, or the text it streamed where ids were held back) and, at a
greedy divergence, the target's logit margin there (`logit_margin`: the server's own
probabilities, /completion with n_probs, on the baseline's server), so that agent/divergence.py
labels a near-tie on a server run as on ours.

The binary is the agent's (`find_binary`) or, for a job whose arms pin a build (`server_build`,
specfleet/server_arms.py), that build's among the agent's (`find_builds`); the engine refuses to
start a binary that is not the build the job pins.
"""

from __future__ import annotations

import logging
import math
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specfleet import settings as declared
from specfleet.record import ENGINE_METHODS, MAX_DEPTH, Settings, least_depth
from specfleet.server_arms import BUILD_KEY_PREFIX, MAX_BUILDS

from .. import prompts
from . import loopback, server_memory
from .base import (
    UNKNOWN_ID,
    EngineError,
    Generation,
    Margin,
    Request,
    ServerRun,
    make_generation,
    margin_problem,
    top_two,
)
from .server_process import HEALTH_TIMEOUT_SECONDS, ServerProcess, free_port

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
PROJECT_BUILD = ROOT / ".data" / "llama.cpp" / "bin" / "llama-server"
SYSTEM = "llama-server"
REQUEST_TIMEOUT_SECONDS = 600.0  # no event for this long: the server is hung
VERSION_TIMEOUT_SECONDS = 30.0

# Types that draft with a second model given by -md (draft-mtp drafts with the target's own head).
DRAFT_MODEL_TYPES = ("draft-simple", "draft-eagle3", "draft-dflash")
# The flag that sets each type's longest draft (common/arg.cpp). ngram-cache has none: it drafts
# a fixed NGRAM_CACHE_DRAFT tokens (create_state_ngram_cache in common/speculative.cpp).
DEPTH_FLAGS = {
    "draft-simple": "--spec-draft-n-max",
    "draft-mtp": "--spec-draft-n-max",
    "draft-eagle3": "--spec-draft-n-max",
    "draft-dflash": "--spec-draft-n-max",
    "ngram-simple": "--spec-ngram-simple-size-m",
    "ngram-map-k": "--spec-ngram-map-k-size-m",
    "ngram-map-k4v": "--spec-ngram-map-k4v-size-m",
    "ngram-mod": "--spec-ngram-mod-n-max",
}
NGRAM_CACHE_DRAFT = 8
STATEFUL_TYPES = ("ngram-mod", "ngram-cache", "ngram-map-k", "ngram-map-k4v")
METRIC_PREFIX = "llamacpp:spec_decode_"
TEXTS_KEPT = 64  # runs whose streamed text is kept for their text samples (one prompt's repeat of every arm)
MARGIN_PROBS = 20  # tokens whose probabilities are asked for at a divergence (n_probs)
BASELINE = ("baseline", 0, ())  # the baseline arm's key: its server answers the margins' requests
# What every request of logit_margin and _fill sends besides its prompt: slot 0, greedy (the
# single most likely token), every generated id returned, and ignore_eos as the runs have it.
GREEDY_ON_SLOT_0 = {
    "id_slot": 0, "ignore_eos": True, "return_tokens": True, "temperature": 0.0, "top_k": 1, "samplers": ["top_k"],
}  # fmt: skip

# "version: 9330 (328874d)" (Homebrew, b9330) or "version: 0.5.0-dev (build 1, commit 0c1e570)".
_VERSION_RE = re.compile(
    r"^version:\s*(?:(?P<build>\d+) \((?P<commit>[0-9a-f]+)\)"
    r"|(?P<release>\S+) \(build (?P<build2>\d+), commit (?P<commit2>[0-9a-f]+)\))",
    re.M,
)


def find_binary(option: str | None = None) -> Path | None:
    """The llama-server to run: `option` (the agent's --llama-server), else the one on PATH
    (Homebrew's on a Mac), else this project's own build; None when there is none."""
    if option:
        return Path(option).expanduser()
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    return PROJECT_BUILD if PROJECT_BUILD.exists() else None


def parse_version(text: str) -> dict[str, str]:
    """llama-server --version's output as {"build", "commit"} (and "release" where it prints one)."""
    m = _VERSION_RE.search(text)
    if not m:
        raise EngineError(f"llama-server --version printed no version line: {text.strip()[:300]!r}")
    if m["build"]:
        return {"build": m["build"], "commit": m["commit"]}
    return {"release": m["release"], "build": m["build2"], "commit": m["commit2"]}


def version_label(version: dict[str, str]) -> str:
    """llama.cpp's own build label ("b9330-328874d", as in its system_fingerprint), after the
    release where there is one."""
    label = f"b{version['build']}-{version['commit']}"
    return f"{version['release']} {label}" if "release" in version else label


def read_version(binary: str | Path) -> dict[str, str]:
    """A llama-server's own `--version`, parsed (parse_version); EngineError when it cannot be read."""
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_SECONDS
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EngineError(f"{binary} --version failed: {e}") from None
    return parse_version(out.stdout + out.stderr)


@dataclass(frozen=True)
class Build:
    """One llama-server binary of the agent's, by the build its --version reports."""

    tag: str  # llama.cpp's release tag of its build number: "b9500" (what a sweep's server_build names)
    label: str  # version_label: what its runs record as server_version
    binary: Path


def find_builds(default: Path | None, configured: Sequence[Path] = ()) -> dict[str, Build]:
    """The agent's llama-server builds by tag: its default binary (find_binary's; left out when
    its --version fails, which `agent doctor` reports) and the configured ones (agent/config.py
    AgentConfig.llama_server_builds; a failing --version is a ValueError, as any wrong setting).
    Of two binaries of one build the first is kept and the other named in a warning."""
    builds: dict[str, Build] = {}
    candidates = [(default, False)] if default is not None else []
    for binary, required in [*candidates, *((b, True) for b in configured)]:
        try:
            version = read_version(binary)
        except EngineError as e:
            if required:
                raise ValueError(f"llama-server build {binary}: {e}") from None
            log.warning("llama-server %s: %s", binary, e)
            continue
        build = Build(f"b{version['build']}", version_label(version), Path(binary).resolve())
        kept = builds.setdefault(build.tag, build)
        if kept.binary != build.binary:
            log.warning("llama-server %s is build %s as %s is: keeping %s", binary, build.tag, kept.binary, kept.binary)
    if len(builds) > MAX_BUILDS:
        raise ValueError(f"{len(builds)} llama-server builds configured; at most {MAX_BUILDS}")
    return builds


def build_versions(builds: dict[str, Build]) -> dict[str, str]:
    """The builds as the fingerprint's engine versions report them (server_arms.fingerprint_builds)."""
    return {BUILD_KEY_PREFIX + tag: b.label for tag, b in builds.items()}


def spec_types(method: str) -> list[str]:
    return [] if method == "baseline" else method.split(",")


def spec_args(method: str, depth: int) -> list[str]:
    """--spec-type and each type's longest-draft flag set to the depth."""
    types = spec_types(method)
    if not types:
        return []
    if types == ["ngram-cache"] and depth != NGRAM_CACHE_DRAFT:
        raise EngineError(
            f"ngram-cache drafts a fixed {NGRAM_CACHE_DRAFT} tokens in llama-server (no flag sets it): "
            f"use depth {NGRAM_CACHE_DRAFT}, not {depth}"
        )
    args = ["--spec-type", method]
    for flag in dict.fromkeys(DEPTH_FLAGS[t] for t in types if t in DEPTH_FLAGS):
        args += [flag, str(depth)]
    return args


def server_argv(
    binary: str,
    target: str,
    draft: str | None,
    port: int,
    shared_flags: Sequence[str],
    method: str,
    depth: int,
    arm_flags: Sequence[str],
) -> list[str]:
    argv = [binary, "-m", target]
    if draft and any(t in DRAFT_MODEL_TYPES for t in spec_types(method)):
        argv += ["-md", draft]
    argv += ["--host", loopback.HOST, "--port", str(port), "--metrics", *shared_flags]
    return argv + spec_args(method, depth) + list(arm_flags)


def spec_counters(metrics_text: str) -> dict[str, float]:
    """llama-server's speculative counters from its /metrics text: name (without the
    "llamacpp:spec_decode_" prefix) -> value, per-position ones as "...per_pos_total/N"."""
    counters = {}
    for line in metrics_text.splitlines():
        if not line.startswith(METRIC_PREFIX):
            continue
        name, _, value = line.rpartition(" ")
        name = name[len(METRIC_PREFIX) :]
        position = re.search(r'\{position="(\d+)"\}', name)
        if position:
            name = name[: position.start()] + "/" + position[1]
        counters[name] = float(value)
    return counters


def by_position(before: dict[str, float], after: dict[str, float]) -> tuple[int, ...]:
    """The run's accepted tokens per draft position: the per-position counters' deltas."""
    key = "num_accepted_tokens_per_pos_total/"
    positions = sorted(int(k[len(key) :]) for k in after if k.startswith(key))
    return tuple(int(after[f"{key}{p}"] - before.get(f"{key}{p}", 0)) for p in positions)


def _keep(kept: dict, key, value) -> None:
    """kept[key] = value, the oldest entries dropped past TEXTS_KEPT."""
    kept[key] = value
    while len(kept) > TEXTS_KEPT:
        del kept[next(iter(kept))]


class LlamaServerEngine:
    name = "llama-server"
    methods = ENGINE_METHODS["llama-server"]

    def __init__(
        self,
        binary: str | None = None,
        flags: Sequence[str] = (),
        memory_bytes: int | None = None,
        log_dir: str | None = None,
        health_timeout_seconds: float = HEALTH_TIMEOUT_SECONDS,
        settings: Settings | None = None,
        build: str = "",
    ):
        found = find_binary(binary)
        if found is None:
            raise EngineError(
                "no llama-server found: not given (the agent's --llama-server PATH), not on PATH "
                f"(`brew install llama.cpp` on a Mac), and not built here ({PROJECT_BUILD}: "
                "scripts/build-llama-cpp.sh)"
            )
        self.binary = str(found)
        self.build = build  # the build the job pins ("b9500"); "" for whichever the binary is
        # The cell's free flags, then the flags of its declared settings (specfleet/settings.py: -t/-tb, ...).
        self.flags = tuple(flags) + tuple(declared.server_argv(settings) if settings is not None else ())
        self.memory_bytes = memory_bytes
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="llama-server-"))
        self.health_timeout_seconds = health_timeout_seconds
        self.target: str = ""
        self.draft: str | None = None
        self.plan = ""  # "rotated" | "blocks", once interleaving() has been asked
        self._servers: dict[tuple, ServerProcess] = {}  # arm key -> its running server
        self._served: dict[tuple, int] = {}  # arm key -> requests its current server has served
        self._version: dict[str, str] | None = None
        self._started = 0
        self._texts: dict[tuple[int, ...], str] = {}  # the last TEXTS_KEPT runs' streamed text, by their tokens
        self._filled: dict[tuple[int, ...], tuple[int, ...]] = {}  # prefixes with held-back ids -> their ids

    # ------------------------------------------------------------------ servers

    def _start(self, key: tuple) -> ServerProcess:
        method, depth, flags = key
        port = free_port()
        argv = server_argv(self.binary, self.target, self.draft, port, self.flags, method, depth, flags)
        self._started += 1
        log = self.log_dir / f"llama-server-{self._started:03d}-{method.replace(',', '+')}-{depth}.log"
        server = ServerProcess(argv, port, log, f"llama-server ({method} {depth})", self.health_timeout_seconds)
        self._servers[key] = server.start()
        self._served[key] = 0
        return server

    def _stop(self, key: tuple) -> None:
        self._servers.pop(key).stop()

    def _server_for(self, key: tuple) -> ServerProcess:
        """The arm's server, started if it is not up; in blocks mode the other arms' are stopped
        first. A server is never restarted here: its state is the protocol's (`restart`)."""
        if self.plan == "blocks":
            for other in [k for k in self._servers if k != key]:
                self._stop(other)
        server = self._servers.get(key)
        if server is not None:
            server.check()  # a server that died is a failed job, never silently replaced
        return server or self._start(key)

    @staticmethod
    def _key(arm) -> tuple:
        return (arm.method, arm.depth, tuple(arm.flags))

    def restart(self, arm) -> None:
        """Stop the arm's server (if it is up): its next request starts a fresh one."""
        if self._key(arm) in self._servers:
            self._stop(self._key(arm))

    def served(self, arm) -> int:
        """Requests the arm's current server has served; 0 when none is up (the next starts one)."""
        key = self._key(arm)
        return self._served.get(key, 0) if key in self._servers else 0

    def _stateful(self, key: tuple) -> bool:
        return any(t in STATEFUL_TYPES for t in spec_types(key[0]))

    def keeps_state(self, arm) -> bool:
        """Whether the arm's drafter keeps state across requests (STATEFUL_TYPES): the protocol
        then measures it on a server started for every run (agent/protocol.py)."""
        return self._stateful(self._key(arm))

    # ------------------------------------------------------------------ Engine

    def load(self, target: str, draft: str | None = None) -> float:
        """Start the baseline server on the target; the seconds until it answered /health."""
        self.target, self.draft = target, draft
        if self.build and f"b{self._versions()['build']}" != self.build:
            raise EngineError(
                f"the job pins llama-server build {self.build}, but {self.binary} is "
                f"{version_label(self._versions())} (has it been replaced since the agent started?)"
            )
        started = time.perf_counter()
        self._server_for(BASELINE)
        return time.perf_counter() - started

    def interleaving(self, arms) -> str:
        estimates = [
            server_memory.server_bytes(
                self.target,
                self.draft if any(t in DRAFT_MODEL_TYPES for t in spec_types(a.method)) else None,
                a.method,
                (*self.flags, *a.flags),
            )
            for a in arms
        ]
        self.plan = "rotated" if server_memory.fits(estimates, self.memory_bytes) else "blocks"
        return self.plan

    def tokenize(self, text: str) -> tuple[int, ...]:
        """The baseline server's /tokenize with special tokens (BOS) added."""
        server = self._server_for(BASELINE)
        try:
            answer = loopback.post_json(server.port, "/tokenize", {"content": text, "add_special": True})
        except OSError as e:
            raise server.died(e) from None
        tokens = answer.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise loopback.BadAnswer(f"POST /tokenize answered no list of token ids: {str(answer)[:300]}")
        return tuple(tokens)

    def chat_template(self) -> str | None:
        """The target GGUF's own chat template, None where it has none (llama-server would serve
        its ChatML fallback: not the model's)."""
        return prompts.gguf_chat_template(self.target) if self.target else None

    def chat_tokenize(self, chat: list[dict[str, str]], reasoning: str | None) -> tuple[int, ...]:
        """The chat rendered by the server itself (POST /apply-template: llama.cpp's own template
        engine, enable_thinking where set), tokenized by its /tokenize with special tokens parsed."""
        server = self._server_for(BASELINE)
        body: dict = {"messages": chat}
        if reasoning is not None:
            body["chat_template_kwargs"] = {"enable_thinking": reasoning == "on"}
        try:
            rendered = loopback.post_json(server.port, "/apply-template", body).get("prompt")
            if not isinstance(rendered, str):
                raise loopback.BadAnswer("POST /apply-template answered no prompt")
            answer = loopback.post_json(
                server.port, "/tokenize", {"content": rendered, "add_special": True, "parse_special": True}
            )
        except OSError as e:
            raise server.died(e) from None
        tokens = answer.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise loopback.BadAnswer(f"POST /tokenize answered no list of token ids: {str(answer)[:300]}")
        return tuple(tokens)

    def _check(self, request: Request) -> None:
        """What the engine itself refuses; an unknown --spec-type is llama-server's to refuse (at
        start, with its own message), since a newer llama-server may know more types than we do."""
        method, depth = request.method, request.depth
        if method == "baseline" and depth != 0:
            raise EngineError(f"baseline takes depth 0, got {depth}")
        least = least_depth(SYSTEM, method)  # --spec-draft-n-max 0: the drafter loaded, its own arm
        if method != "baseline" and not least <= depth <= MAX_DEPTH:
            raise EngineError(f"--spec-type {method} needs a depth from {least} to {MAX_DEPTH}, got {depth}")
        if not request.prompt_tokens:
            raise EngineError("the prompt is empty")
        if request.max_new_tokens < 1:
            raise EngineError(f"max_new_tokens must be at least 1, got {request.max_new_tokens}")

    def _body(self, request: Request) -> dict:
        s = request.sampler
        chain = sorted((row for row in declared.SAMPLER if row.server_sampler), key=lambda row: row.chain)
        body = {
            "prompt": list(request.prompt_tokens),
            "n_predict": request.max_new_tokens,
            "ignore_eos": True,
            "cache_prompt": False,
            "stream": True,
            "return_tokens": True,
            # Only the declared sampler rows, in llama.cpp's own order (min_p, 0.05 by default, off unless
            # the cell sets it), each at the cell's value.
            "samplers": [row.server_sampler for row in chain],
            "min_p": 0.0,
            **declared.sampler_request(s),
        }
        if s.greedy:  # temperature 0 and the single most likely token: argmax, whatever the chain
            return {**body, "temperature": 0.0, "top_k": 1, "top_p": 1.0}
        return body

    def generate(self, request: Request) -> Generation:
        self._check(request)
        key = (request.method, request.depth, tuple(request.flags))
        server = self._server_for(key)
        warm = (self._served[key] > 0) if self._stateful(key) else None
        try:
            before = spec_counters(self._metrics(server))
            tokens, times, text, final = [], [], [], None
            started = time.perf_counter()
            for arrived, event in loopback.stream_events(
                server.port, "/completion", self._body(request), REQUEST_TIMEOUT_SECONDS
            ):
                ids, count = event.get("tokens") or [], event.get("tokens_predicted")
                if not isinstance(count, int) or count < len(tokens) + len(ids):
                    raise loopback.BadAnswer(f"{server.name} streamed an event without a token count: {event}")
                # Tokens held back while their text was incomplete UTF-8 arrive with this event,
                # counted but without their ids.
                tokens += [UNKNOWN_ID] * (count - len(tokens) - len(ids)) + ids
                times += [arrived - started] * (len(tokens) - len(times))
                text.append(str(event.get("content") or ""))
                if event.get("stop"):
                    final = event
            self._served[key] += 1
            after = spec_counters(self._metrics(server))
        except OSError as e:
            raise server.died(e) from None
        timings = (final or {}).get("timings")
        if final is None and not server.alive():
            raise server.died(ConnectionError("the stream ended before its final event"))
        if not isinstance(timings, dict) or not {"prompt_ms", "predicted_ms", "predicted_n"} <= timings.keys():
            raise loopback.BadAnswer(
                f"{server.name}: the stream ended without a final event carrying timings "
                f"(prompt_ms, predicted_ms, predicted_n); last event: {str(final)[:300]}"
            )
        if len(tokens) != request.max_new_tokens or not all(isinstance(t, int) for t in tokens):
            full = ": the prompt and generation do not fit in its context (-c)" if final.get("truncated") else ""
            raise loopback.BadAnswer(
                f"{server.name} streamed {len(tokens)} tokens for n_predict {request.max_new_tokens} "
                f"(stop_type {final.get('stop_type')!r}){full}"
            )
        self._keep_text(tokens, "".join(text))
        gen = make_generation(request, tokens, times)
        speculative = request.method != "baseline"
        drafts = int(after.get("num_drafts_total", 0) - before.get("num_drafts_total", 0))
        accepted_at = by_position(before, after) if speculative else ()
        gen.server = ServerRun(
            system=SYSTEM,
            version=version_label(self._versions()),
            command=server.command,
            flags=shlex.join(self.flags),
            decode_tokens_per_second=(
                timings["predicted_n"] / (timings["predicted_ms"] / 1000) if timings["predicted_ms"] > 0 else None
            ),
            prefill_seconds=timings["prompt_ms"] / 1000,
            drafted=int(timings.get("draft_n", 0)) if speculative else None,
            accepted=int(timings.get("draft_n_accepted", 0)) if speculative else None,
            drafted_by_position=(drafts,) * len(accepted_at) if drafts else (),
            accepted_by_position=accepted_at if drafts else (),
            drafter_warm=warm,
            interleaving=self.plan,
        )
        return gen

    # ------------------------------------------------------------------ text and margins

    def _keep_text(self, tokens: list[int], text: str) -> None:
        _keep(self._texts, tuple(tokens), text)

    def _on_baseline(self, body: dict) -> tuple[ServerProcess, dict]:
        """One non-streamed POST /completion of GREEDY_ON_SLOT_0 and `body` to the baseline's
        server, counted as served; its server and answer."""
        server = self._server_for(BASELINE)
        try:
            answer = loopback.post_json(server.port, "/completion", {**GREEDY_ON_SLOT_0, **body})
        except OSError as e:
            raise server.died(e) from None
        self._served[BASELINE] += 1
        return server, answer

    def detokenize(self, tokens: Sequence[int]) -> str:
        """A run's text, for its text sample (agent/summary.py): llama-server's own POST /detokenize
        on a server that is up (special tokens rendered, as the in-process engines render them);
        where the stream held some ids back (UNKNOWN_ID) or no server is up, the text the run
        streamed (special tokens not rendered: llama-server's content)."""
        server = next((s for s in self._servers.values() if s.alive()), None)
        if server is not None and UNKNOWN_ID not in tokens:
            try:
                content = loopback.post_json(server.port, "/detokenize", {"tokens": list(tokens)}).get("content")
            except OSError as e:
                raise server.died(e) from None
            if isinstance(content, str):
                return content
        if tuple(tokens) in self._texts:
            return self._texts[tuple(tokens)]
        raise EngineError("no text kept for these tokens and no server up to detokenize them")

    def logit_margin(
        self, tokens: Sequence[int], position: int, rows: int = 1, pair: tuple[int, int] | None = None
    ) -> Margin:
        """base.Engine.logit_margin from llama-server's own probabilities (/completion with
        n_probs: the softmax of the raw logits, whose log differences are the logits' own), on the
        baseline's server and its slot 0: a first request caches tokens[:position - rows] (its one
        generated token is never decoded), a second sends tokens[:position] with cache_prompt, so
        that its last `rows` tokens are one batch on top of the cache (rows 1: one-token
        decoding, as the baseline runs), and the first generated token's probabilities are those
        of `position`. Ids the stream held back (UNKNOWN_ID) before the position are filled first
        (`_fill`). Every request counts as served (`served`). EngineError when a token of the pair
        (or, without one, the second best) is not among the top MARGIN_PROBS, when the pair holds
        an UNKNOWN_ID, or when the held-back ids cannot be filled."""
        problem = margin_problem(tokens, position, rows)
        if not problem and UNKNOWN_ID in (pair or ()):
            problem = "logit_margin: a token of the pair is one whose id the stream held back (UNKNOWN_ID)"
        if problem:
            raise EngineError(problem)
        tokens = self._fill(tokens[:position])
        body = {"n_predict": 1, "n_probs": MARGIN_PROBS, "cache_prompt": True}
        if position > rows:
            self._on_baseline({**body, "prompt": list(tokens[: position - rows])})
        server, answer = self._on_baseline({**body, "prompt": list(tokens[:position])})
        cached = (answer.get("timings") or {}).get("cache_n")
        if cached != max(position - rows, 0):
            raise EngineError(
                f"llama-server reused {cached} cached tokens of {position - rows} for a {rows}-row batch: no margin"
            )
        probs = answer.get("completion_probabilities") or [{}]
        top = {p.get("id"): p.get("logprob") for p in probs[0].get("top_logprobs") or [] if isinstance(p, dict)}
        if not top or not all(isinstance(v, (int, float)) for v in top.values()):
            raise loopback.BadAnswer(f"{server.name}: /completion with n_probs answered no top_logprobs: {probs[:1]}")
        logits = [top.get(i, -math.inf) for i in range(max([*top, *(pair or ())]) + 1)]
        if pair is not None:
            missing = [t for t in pair if t not in top]
            if missing:
                raise EngineError(
                    f"llama-server: token(s) {missing} not among the top {MARGIN_PROBS} at position {position}: "
                    "no margin"
                )
            return top_two(logits, pair=pair)
        if len(top) < 2:
            raise EngineError(f"llama-server: fewer than two tokens with a probability at position {position}")
        return top_two(logits)

    def _fill(self, prefix: Sequence[int]) -> tuple[int, ...]:
        """The prefix with the ids its stream held back (UNKNOWN_ID) filled in: one non-streamed
        greedy /completion on the baseline's server from the tokens before the first held-back id,
        for the rest of the prefix (a non-streamed answer carries every generated id: `tokens`),
        with ignore_eos as the runs have it. Its ids must equal every id the prefix does know:
        that continuation prefills what the run decoded one token at a time, so at a near-tie it
        may take another path, and then the prefix's ids stay unknown (EngineError, naming where).
        Kept for the engine's last TEXTS_KEPT prefixes (a divergence asks once per batch size)."""
        prefix = tuple(prefix)
        if UNKNOWN_ID not in prefix:
            return prefix
        if prefix in self._filled:
            return self._filled[prefix]
        start = prefix.index(UNKNOWN_ID)
        if start == 0:
            raise EngineError("logit_margin: the prefix starts with a held-back id (UNKNOWN_ID): nothing to fill from")
        server, answer = self._on_baseline(
            {"prompt": list(prefix[:start]), "n_predict": len(prefix) - start, "stream": False, "cache_prompt": False}
        )
        ids = answer.get("tokens")
        if not isinstance(ids, list) or len(ids) != len(prefix) - start or not all(isinstance(t, int) for t in ids):
            raise loopback.BadAnswer(
                f"{server.name}: a non-streamed /completion of {len(prefix) - start} tokens answered no such "
                f"list of token ids: {str(ids)[:300]}"
            )
        for at, (known, got) in enumerate(zip(prefix[start:], ids), start):
            if known not in (UNKNOWN_ID, got):
                raise EngineError(
                    f"logit_margin: the held-back ids cannot be filled: llama-server's greedy continuation from "
                    f"token {start} gives {got} at token {at} where the run has {known}"
                )
        filled = prefix[:start] + tuple(ids)
        _keep(self._filled, prefix, filled)
        return filled

    def _metrics(self, server: ServerProcess) -> str:
        status, body = loopback.request(server.port, "GET", "/metrics")
        if status != 200:
            raise loopback.BadAnswer(f"{server.name}: GET /metrics answered HTTP {status} (started with --metrics)")
        return body.decode(errors="replace")

    def _versions(self) -> dict[str, str]:
        if self._version is None:
            self._version = read_version(self.binary)
        return self._version

    def versions(self) -> dict[str, str]:
        return {f"llama-server.{k}": v for k, v in self._versions().items()}

    def verify_cost(self, context_tokens: int, max_rows: int = 16, repeats: int = 5) -> list[float]:
        raise EngineError("verify-cost needs an in-process engine (llama.cpp or mlx): a server hides its forwards")

    def close(self) -> None:
        """Stop every server this engine started."""
        for key in list(self._servers):
            self._stop(key)
