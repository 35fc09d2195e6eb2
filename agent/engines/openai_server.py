"""Engine `openai`: any OpenAI-compatible server (MTPLX, OptiQ, oMLX, mlx_lm.server, LM Studio,
vLLM, llama-server's own /v1 endpoints), measured as a streaming client.

Where the server comes from: an arm's `command` template, else the cell's `server.command` for
every arm without one, else the server already running at the cell's `server.url`, which must be
on this machine (127.0.0.1, localhost or ::1). A template is split like a shell line and may use
{model} (the target's local path), {depth} (the arm's) and {port}, as the sweep file does
(specfleet/server_arms.py); it must use {port},
because the engine picks a free loopback port for every server it starts (a server that listens
elsewhere would be waited for in vain). Servers started here are ready when GET /health, or
where that is 404, GET /v1/models, answers 200; they are stopped with the engine (close()).

A run is one streamed POST /v1/completions (/v1/chat/completions with the prompt's messages when
the cell's prompt_format is chat: agent/prompts.py) with `max_tokens`, the cell's sampler (temperature 0
for greedy), `stream_options.include_usage` and `ignore_eos: true` (every run exactly
max_new_tokens tokens, as everywhere else in the fleet; a server that stops early fails the
run, naming its finish_reason); `cache_prompt: false` is added for llama-server's benefit (other
servers ignore it; those with a prompt cache may serve repeats from it). The client stamps every
event that carries text. The token count is the server's `usage.completion_tokens`: the events
are one per token on the servers we know, and where a server sends fewer events than tokens the
extra tokens are counted at its last text event (no figure depends on where: decode speed uses
the first and last arrival, inter-token gaps the distinct arrivals).

An OpenAI stream carries text, not token ids, so `Generation.tokens` are not ids: all -1 (not
known) but the last, a 31-bit digest of the streamed text, so that two runs compare equal
exactly when they streamed the same text in as many tokens (the protocol's lossless check). The
streamed text itself is what `detokenize` gives back for those tokens (the run's text sample).

Prompts: the protocol hands token ids (context and prompt tokens joined). Each server is probed
once when it starts: if it completes a prompt given as token ids (llama-server and vLLM do) it
gets the ids; otherwise (mlx_lm.server, which takes text only) it gets their text, decoded with
the model's tokenizer and special tokens dropped, and tokenizes that itself. `tokenize` asks
the baseline's server's /tokenize (llama-server's form, BOS added) and, where it has none,
transformers' AutoTokenizer on the target's local model directory.

What the engine reads from a server's answers: `usage` (token counts), `system_fingerprint` (the
version it records, where sent) and llama-server's `timings` (its own decode speed, prefill time
and draft counts) where a server adds them. Nothing else is assumed; the server's memory is not
measured (`peak_memory_bytes` 0).
"""

from __future__ import annotations

import hashlib
import re
import shlex
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from specfleet import settings as declared
from specfleet.record import MAX_DEPTH, OPENAI_METHODS, ServerSpec
from specfleet.server_arms import recorded_flags

from .. import prompts
from . import loopback, server_memory
from .base import UNKNOWN_ID, EngineError, Generation, Request, ServerRun, make_generation
from .server_process import HEALTH_TIMEOUT_SECONDS, ServerProcess, free_port

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
PLACEHOLDERS = ("model", "depth", "port")
HEALTH_PATHS = ("/health", "/v1/models")
REQUEST_TIMEOUT_SECONDS = 600.0
PROBE_TEXT = "Hello"
TEXTS_KEPT = 64  # runs whose streamed text is kept for their text samples (one prompt's repeat of every arm)


def loopback_address(url: str) -> tuple[str, int]:
    """(host, port) of a server URL that must be this machine's (http://127.0.0.1:8000)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in LOOPBACK_HOSTS:
        raise EngineError(
            f"server.url {url!r} is not a plain http URL on this machine ({', '.join(LOOPBACK_HOSTS)}): "
            "a benchmark measures the machine it runs on"
        )
    if parts.path not in ("", "/") or parts.query:
        raise EngineError(f"server.url {url!r} must be the server's root (http://127.0.0.1:PORT), without a path")
    return parts.hostname, parts.port or 80


def check_template(template: str) -> None:
    """Refuse a command template without {port} or with a placeholder we do not fill."""
    if "{port}" not in template:
        raise EngineError(
            f"server command {template!r} has no {{port}}: the engine gives every server it starts a free "
            "loopback port and must tell it which"
        )
    unknown = sorted(set(re.findall(r"\{(\w*)\}", template)) - set(PLACEHOLDERS))
    if unknown:
        raise EngineError(
            f"server command {template!r} uses unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)}; "
            f"known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
        )


def expand(template: str, model: str, depth: int, port: int) -> list[str]:
    """A command template's argv with its placeholders filled in."""
    check_template(template)
    values = {"model": model, "depth": str(depth), "port": str(port)}
    argv = shlex.split(template)
    for name, value in values.items():
        argv = [arg.replace("{" + name + "}", value) for arg in argv]
    return argv


def token_times(arrivals: list[float], count: int) -> list[float]:
    """Each of `count` tokens' arrival from the text events' arrivals: one token per event, extra
    tokens at the last event; with more events than tokens, the last token at the last event."""
    if count <= len(arrivals):
        return arrivals[: count - 1] + [arrivals[-1]]
    return arrivals + [arrivals[-1]] * (count - len(arrivals))


def text_digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & 0x7FFFFFFF


def path_bytes(path: str) -> int | None:
    """Bytes of a model file or directory; None when it is not a local path."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    if p.is_dir():
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return None


VERSION_TIMEOUT_SECONDS = 10.0  # a program that ignores --version and serves instead is stopped then


@dataclass
class Endpoint:
    """One server the engine talks to: started by it (`process`) or already running."""

    host: str
    port: int
    command: str  # shell-quoted argv ("" for a server already running)
    process: ServerProcess | None = None
    takes_ids: bool = False
    model: str = ""  # the id /v1/models names first, sent as "model" ("" if it names none)
    fingerprint: str = ""  # system_fingerprint of its answers
    version: str = ""  # the version of the program its command runs (command_version)


def command_version(argv: list[str]) -> str:
    """The version of the program a server command runs, as its package says it (`python -m
    mtplx.server ...`: the distribution that provides mtplx; `mtplx serve ...`: the one whose
    console script it is) or else as its own `--version` prints it (first line); "" when neither
    tells. Recorded with the run (server_version, a checked key): two releases are never pooled."""
    program = Path(argv[0]).name
    if program.startswith("python") and "-m" in argv[:-1]:
        top = argv[argv.index("-m") + 1].split(".")[0]
        dists = metadata.packages_distributions().get(top, [])
        return f"{dists[0]} {metadata.version(dists[0])}" if dists else ""
    scripts = [ep for ep in metadata.entry_points(group="console_scripts") if ep.name == program]
    if scripts and scripts[0].dist is not None:
        return f"{scripts[0].dist.name} {scripts[0].dist.version}"
    try:
        done = subprocess.run([argv[0], "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_SECONDS)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines() if line.strip()]
    return lines[0][:200] if done.returncode == 0 and lines else ""


class OpenAIServerEngine:
    name = "openai"
    methods = OPENAI_METHODS

    def __init__(
        self,
        server: ServerSpec | None = None,
        memory_bytes: int | None = None,
        log_dir: str | None = None,
        health_timeout_seconds: float = HEALTH_TIMEOUT_SECONDS,
    ):
        self.spec = server or ServerSpec()
        self.system = self.spec.system or "openai"
        if self.spec.command:
            check_template(self.spec.command)  # refused before anything starts
        self.url = loopback_address(self.spec.url) if self.spec.url else None
        self.memory_bytes = memory_bytes
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="openai-server-"))
        self.health_timeout_seconds = health_timeout_seconds
        self.target, self.draft = "", None
        self.plan = ""
        self._endpoints: dict[tuple, Endpoint] = {}
        self._tokenizer = None  # transformers' tokenizer, loaded on first need
        self._server_tokenizes: bool | None = None
        self._probe_ids: tuple[int, ...] = ()
        self._chats: dict[tuple[int, ...], tuple[list, dict]] = {}  # chat prompt tokens -> (messages, kwargs)
        self._texts: dict[tuple[int, ...], str] = {}  # a run's tokens -> the text it streamed (text samples)
        self._started = 0

    # ------------------------------------------------------------------ servers

    def _key(self, method: str, depth: int, command: str) -> tuple:
        template = command or self.spec.command
        if template:
            return ("command", template, depth if "{depth}" in template else 0)
        if self.url:
            return ("url",)
        raise EngineError(
            f"arm {method} {depth} has no command, and the cell has neither server.command nor server.url"
        )

    def _endpoint(self, key: tuple) -> Endpoint:
        if self.plan == "blocks":
            for other in [k for k, e in self._endpoints.items() if k != key and e.process]:
                self._endpoints.pop(other).process.stop()
        endpoint = self._endpoints.get(key)
        if endpoint is not None:
            if endpoint.process:
                endpoint.process.check()
            return endpoint
        if key[0] == "url":
            endpoint = Endpoint(*self.url, command="")
            status = self._health(endpoint)
            if status != 200:
                raise EngineError(f"{self.system} at {self.spec.url}: GET /health and /v1/models answered {status}")
        else:
            port = free_port()
            argv = expand(key[1], self.target, key[2], port)
            self._started += 1
            log = self.log_dir / f"server-{self._started:03d}.log"
            process = ServerProcess(argv, port, log, self.system, self.health_timeout_seconds, HEALTH_PATHS)
            endpoint = Endpoint(loopback.HOST, port, process.command, process.start(), version=command_version(argv))
        self._endpoints[key] = endpoint
        if self._probe_ids:  # known once load() has tokenized; load probes its own server then
            self._probe(endpoint)
        return endpoint

    def _health(self, endpoint: Endpoint) -> int | str:
        status: int | str = "no answer"
        for path in HEALTH_PATHS:
            try:
                status = loopback.request(endpoint.port, "GET", path, host=endpoint.host, timeout=10)[0]
            except OSError as e:
                return f"{type(e).__name__}: {e}"
            if status != 404:
                return status
        return status

    def _call(self, endpoint: Endpoint, fn):
        try:
            return fn()
        except OSError as e:
            if endpoint.process:
                raise endpoint.process.died(e) from None
            raise EngineError(f"{self.system} at {self.spec.url}: {type(e).__name__}: {e}") from None

    def _probe(self, endpoint: Endpoint) -> None:
        """What a new server answers: its model id, its fingerprint, whether it takes token ids."""
        status, body = self._call(
            endpoint, lambda: loopback.request(endpoint.port, "GET", "/v1/models", host=endpoint.host)
        )
        try:  # optional: mlx_lm.server, for one, answers 200 with an empty body
            models = loopback.json_of(status, body, "GET /v1/models").get("data") or []
        except loopback.BadAnswer:
            models = []
        endpoint.model = str(models[0].get("id", "")) if models and isinstance(models[0], dict) else ""
        answer = self._complete(endpoint, PROBE_TEXT)
        endpoint.fingerprint = str(answer.get("system_fingerprint") or "")
        status, _ = self._call(
            endpoint,
            lambda: loopback.request(
                endpoint.port,
                "POST",
                "/v1/completions",
                self._params(endpoint, list(self._probe_ids), 1),
                host=endpoint.host,
            ),
        )
        endpoint.takes_ids = status == 200

    def _complete(self, endpoint: Endpoint, prompt) -> dict:
        answer = self._call(
            endpoint,
            lambda: loopback.post_json(
                endpoint.port, "/v1/completions", self._params(endpoint, prompt, 1), host=endpoint.host
            ),
        )
        if not isinstance(answer.get("choices"), list):
            raise loopback.BadAnswer(f"{self.system}: POST /v1/completions answered no choices: {str(answer)[:300]}")
        return answer

    def _params(self, endpoint: Endpoint, prompt, max_tokens: int) -> dict:
        params = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
        if endpoint.model:
            params["model"] = endpoint.model
        return params

    # ------------------------------------------------------------------ tokenizer

    def _auto_tokenizer(self):
        if self._tokenizer is None:
            if not Path(self.target).is_dir():
                raise EngineError(
                    f"{self.system} has no /tokenize and the target {self.target} is not a local model directory "
                    "whose tokenizer could be loaded: the engine cannot tokenize prompts for it"
                )
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.target)
        return self._tokenizer

    def tokenize(self, text: str) -> tuple[int, ...]:
        """The baseline's server's /tokenize (BOS added), else the model's own tokenizer."""
        if self._server_tokenizes is not False:
            endpoint = self._endpoint(self._key("baseline", 0, ""))
            status, body = self._call(
                endpoint,
                lambda: loopback.request(
                    endpoint.port, "POST", "/tokenize", {"content": text, "add_special": True}, host=endpoint.host
                ),
            )
            tokens = loopback.json_of(status, body, "POST /tokenize").get("tokens") if status == 200 else None
            self._server_tokenizes = isinstance(tokens, list) and all(isinstance(t, int) for t in tokens)
            if self._server_tokenizes:
                return tuple(tokens)
        return tuple(self._auto_tokenizer()(text)["input_ids"])

    def chat_template(self) -> str | None:
        """The target's own chat template: a GGUF's tokenizer.chat_template, a model directory's
        tokenizer's; None where it has none (a server's fallback template is not the model's)."""
        if Path(self.target).is_file() and self.target.endswith(".gguf"):
            return prompts.gguf_chat_template(self.target)
        if not Path(self.target).is_dir():
            return None
        return getattr(self._auto_tokenizer(), "chat_template", None) or None

    def chat_tokenize(self, chat: list[dict[str, str]], reasoning: str | None) -> tuple[int, ...]:
        """The chat's prompt tokens as the server will see them (its POST /apply-template and
        /tokenize where it has them, else the model's tokenizer's apply_chat_template); the chat
        is kept for the runs of these tokens, which are sent as /v1/chat/completions messages."""
        kwargs = prompts.template_kwargs(reasoning)
        tokens = None
        if self._server_tokenizes is not False:
            endpoint = self._endpoint(self._key("baseline", 0, ""))
            body = {"messages": chat, **({"chat_template_kwargs": kwargs} if kwargs else {})}
            status, answer = self._call(
                endpoint, lambda: loopback.request(endpoint.port, "POST", "/apply-template", body, host=endpoint.host)
            )
            rendered = loopback.json_of(status, answer, "POST /apply-template").get("prompt") if status == 200 else None
            if isinstance(rendered, str):
                status, answer = self._call(
                    endpoint,
                    lambda: loopback.request(
                        endpoint.port,
                        "POST",
                        "/tokenize",
                        {"content": rendered, "add_special": True, "parse_special": True},
                        host=endpoint.host,
                    ),
                )
                got = loopback.json_of(status, answer, "POST /tokenize").get("tokens") if status == 200 else None
                if isinstance(got, list) and all(isinstance(t, int) for t in got):
                    tokens = tuple(got)
        if tokens is None:
            tokenizer = self._auto_tokenizer()
            rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False, **kwargs)
            tokens = tuple(tokenizer(rendered, add_special_tokens=False)["input_ids"])
        self._chats[tokens] = (chat, kwargs)
        return tokens

    def _prompt(self, endpoint: Endpoint, tokens: Sequence[int]):
        if endpoint.takes_ids:
            return list(tokens)
        return self._auto_tokenizer().decode(list(tokens), skip_special_tokens=True)

    # ------------------------------------------------------------------ Engine

    def load(self, target: str, draft: str | None = None) -> float:
        """Start (or reach) the baseline's server; the seconds until it answered and was probed."""
        self.target, self.draft = target, draft
        started = time.perf_counter()
        endpoint = self._endpoint(self._key("baseline", 0, ""))
        self._probe_ids = self.tokenize(PROBE_TEXT)
        self._probe(endpoint)
        return time.perf_counter() - started

    def interleaving(self, arms) -> str:
        """ "rotated" when one server serves every arm or all the arms' servers fit in memory
        together (model files and SERVER_OVERHEAD_BYTES each: a server's context is unknown here,
        so no KV-cache term), else "blocks"."""
        keys = {self._key(a.method, a.depth, a.command) for a in arms}
        started = [k for k in keys if k[0] == "command"]
        if len(started) <= 1:
            self.plan = "rotated"
            return self.plan
        sizes = [path_bytes(self.target)] + ([path_bytes(self.draft)] if self.draft else [])
        if any(size is None for size in sizes):
            self.plan = "blocks"
            return self.plan
        per_server = sum(sizes) + server_memory.SERVER_OVERHEAD_BYTES
        self.plan = "rotated" if server_memory.fits([per_server] * len(started), self.memory_bytes) else "blocks"
        return self.plan

    def _check(self, request: Request) -> None:
        if request.method not in OPENAI_METHODS:
            raise EngineError(f"engine openai labels arms {', '.join(OPENAI_METHODS)}, not {request.method!r}")
        if request.method == "baseline" and request.depth != 0:
            raise EngineError(f"baseline takes depth 0, got {request.depth}")
        if request.method != "baseline" and not 1 <= request.depth <= MAX_DEPTH:
            raise EngineError(f"arm {request.method} needs a depth from 1 to {MAX_DEPTH}, got {request.depth}")
        if not request.prompt_tokens or request.max_new_tokens < 1:
            raise EngineError("a run needs prompt tokens and max_new_tokens of at least 1")

    def generate(self, request: Request) -> Generation:
        self._check(request)
        endpoint = self._endpoint(self._key(request.method, request.depth, request.command))
        s = request.sampler
        chat = getattr(request.settings, "prompt_format", None) == "chat"
        if chat:
            if tuple(request.prompt_tokens) not in self._chats:
                raise EngineError(
                    f"{self.system}: a chat request carries messages, not tokens: prompt_format chat needs prompts "
                    "rendered by this engine and no context_tokens before them (use prompt_format raw)"
                )
            messages, kwargs = self._chats[tuple(request.prompt_tokens)]
            params = self._params(endpoint, None, request.max_new_tokens)
            params.pop("prompt")
            params["messages"] = messages
            if kwargs:
                params["chat_template_kwargs"] = kwargs
        else:
            params = self._params(endpoint, self._prompt(endpoint, request.prompt_tokens), request.max_new_tokens)
        path = "/v1/chat/completions" if chat else "/v1/completions"
        # The declared sampler rows by their request keys, those at their "none" value (top_k 0) left
        # out; greedy: temperature 0 and no truncation.
        sampling = {
            row.request_key: v
            for row in declared.SAMPLER
            if row.request_key and (v := getattr(s, row.key)) is not None and (row.unset is None or v != row.unset)
        }
        if s.greedy:
            sampling = {"temperature": 0.0, "top_p": 1.0, "seed": s.seed}
        body = {
            **params,
            **sampling,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "cache_prompt": False,
        }
        arrivals, pieces, usage, timings, finish = [], [], None, None, None

        def stream() -> None:
            nonlocal usage, timings, finish
            started = time.perf_counter()
            for arrived, event in loopback.stream_events(
                endpoint.port, path, body, REQUEST_TIMEOUT_SECONDS, host=endpoint.host
            ):
                choices = event.get("choices") or []
                choice = choices[0] if choices and isinstance(choices[0], dict) else {}
                delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
                text = choice.get("text") or delta.get("content") or delta.get("reasoning_content")
                if text:
                    arrivals.append(arrived - started)
                    pieces.append(str(text))
                finish = choice.get("finish_reason") or finish
                usage = event.get("usage") or usage
                timings = event.get("timings") or timings

        self._call(endpoint, stream)
        count = (usage or {}).get("completion_tokens")
        if not isinstance(count, int) or not arrivals:
            raise loopback.BadAnswer(
                f"{self.system}: the stream carried no usage.completion_tokens (stream_options.include_usage) "
                f"or no text: the engine cannot count the run's tokens (usage {usage}, {len(arrivals)} text events)"
            )
        if count != request.max_new_tokens:
            raise EngineError(
                f"{self.system} generated {count} tokens, not the {request.max_new_tokens} asked for "
                f"(finish_reason {finish!r}): it does not honour ignore_eos, so its runs would differ in length"
            )
        times = token_times(arrivals, count)
        tokens = [UNKNOWN_ID] * (count - 1) + [text_digest("".join(pieces))]
        self._texts[tuple(tokens)] = "".join(pieces)
        while len(self._texts) > TEXTS_KEPT:
            del self._texts[next(iter(self._texts))]
        gen = make_generation(request, tokens, times)
        gen.server = self._server_run(endpoint, request, timings if isinstance(timings, dict) else {})
        return gen

    def _server_run(self, endpoint: Endpoint, request: Request, timings: dict) -> ServerRun:
        """What the server said of the run: llama-server's `timings` where it sent them."""
        predicted_ms, predicted_n = timings.get("predicted_ms"), timings.get("predicted_n")
        speculative = request.method != "baseline"
        fingerprint = f"fingerprint {endpoint.fingerprint}" if endpoint.fingerprint else ""
        return ServerRun(
            system=self.system,
            version=" ".join(v for v in (endpoint.version, fingerprint) if v),
            command=endpoint.command,
            flags=recorded_flags(self.spec.command) if self.spec.command else "",
            decode_tokens_per_second=predicted_n / (predicted_ms / 1000) if predicted_ms and predicted_n else None,
            prefill_seconds=timings["prompt_ms"] / 1000 if "prompt_ms" in timings else None,
            drafted=int(timings.get("draft_n", 0)) if speculative and timings else None,
            accepted=int(timings.get("draft_n_accepted", 0)) if speculative and timings else None,
            interleaving=self.plan,
        )

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text a run streamed, for its text sample (agent/summary.py): its tokens are no ids
        (module docstring), so the text is kept by them for the last TEXTS_KEPT runs."""
        if tuple(tokens) not in self._texts:
            raise EngineError("no streamed text kept for these tokens")
        return self._texts[tuple(tokens)]

    def versions(self) -> dict[str, str]:
        endpoint = self._endpoints.get(self._key("baseline", 0, ""))
        fingerprint = endpoint.fingerprint if endpoint else ""
        return {"openai.system": self.system, **({"openai.fingerprint": fingerprint} if fingerprint else {})}

    def verify_cost(self, context_tokens: int, max_rows: int = 16, repeats: int = 5) -> list[float]:
        raise EngineError("verify-cost needs an in-process engine (llama.cpp or mlx): a server hides its forwards")

    def close(self) -> None:
        """Stop every server this engine started (a server already running is left alone)."""
        for key in list(self._endpoints):
            endpoint = self._endpoints.pop(key)
            if endpoint.process:
                endpoint.process.stop()
