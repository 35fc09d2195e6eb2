"""Server arms in a sweep file: each arm is a server configuration (engines llama-server, openai).

llama-server arms name a `--spec-type` (or a comma list of them, as llama.cpp accepts) with
depths and the type's own parameters, or hold a whole command line as the seeds write one:

    server: {flags: "-ngl 99 -fa on -c 65536 --parallel 1"}
    arms:
      - {spec_type: draft-mtp, depths: [1, 2, 3]}
      - {spec_type: ngram-mod, depths: [64], params: {n_match: 24, n_min: 48}}
      - command: >-
          llama-server -m Qwen3.5-9B-MTP-Q4_K_M.gguf -ngl 99 --port 8080
          --spec-type draft-mtp --spec-draft-n-max 6

The depth is `--spec-draft-n-max` for model-drafted types and the type's own maximum for the
n-gram types (llama-server's `n_max` rule in common/speculative.cpp); the engine turns it into
the flag. A command line's model must be the sweep's: a comparison is within one model (for a
draft-mtp claim the baseline is the MTP GGUF without the flag, which the seed says runs
normally), and its host and port are the agent's to choose.

openai arms are command templates of an OpenAI-compatible server ({model}, {depth}, {port}):

    server: {system: MTPLX, command: "mtplx serve --model {model} --port {port}"}
    arms:
      - {method: mtp, depths: [1, 2, 3], command: "mtplx serve --model {model} --mtp --depth {depth} --port {port}"}

or, with `server.url`, the one configuration of a server that is already running on loopback.

A llama-server arm may pin the build it runs (`server_build: b9500`, llama.cpp's release tag; a
command-line arm takes it beside its `command`), where agents have several llama-server binaries
side by side (agent/config.py `llama_server_builds`). Arms are grouped by build
(`by_build`): each build is a cell of its own, its baseline run on that build too, so a speedup is
always within one build and the Versions page compares the builds (specfleet/versions.py). The
scheduler gives a pinned cell only to agents that report the build (`fingerprint_builds`).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlparse

from specfleet import settings as declared
from specfleet.record import MAX_DEPTH, OPENAI_METHODS, SERVER_SPEC_TYPES, Arm, ServerSpec, is_method, least_depth
from specfleet.schemas import setting_type

SERVER_KEYS = {"flags", "system", "command", "url"}
LLAMA_SERVER_ARM_KEYS = {"spec_type", "depths", "params", "flags", "command", "server_build"}
BUILD_FIELD = "server_build"
BUILD_RE = re.compile(r"^b?(\d{1,9})$")  # llama.cpp's release tags: b9500 (a bare 9500 is taken too)
# An agent's llama-server builds in its fingerprint's engine_versions: "llama-server@b9500" -> its
# version label ("b9500-328874d"), one entry per binary (agent/engines/llama_server.py find_builds).
BUILD_KEY_PREFIX = "llama-server@"
MAX_BUILDS = 16  # per agent: the fingerprint holds at most 32 engine versions
OPENAI_ARM_KEYS = {"method", "depths", "command"}
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
MAX_FLAGS = 64

# The flag that holds a type's draft maximum in llama.cpp (common/arg.cpp), and its default.
DEPTH_FLAGS = {
    "draft-simple": ("--spec-draft-n-max", 3),
    "draft-mtp": ("--spec-draft-n-max", 3),
    "draft-eagle3": ("--spec-draft-n-max", 3),
    "draft-dflash": ("--spec-draft-n-max", 3),
    "ngram-simple": ("--spec-ngram-simple-size-m", 48),
    "ngram-map-k": ("--spec-ngram-map-k-size-m", 48),
    "ngram-map-k4v": ("--spec-ngram-map-k4v-size-m", 48),
    "ngram-mod": ("--spec-ngram-mod-n-max", 64),
    "ngram-cache": ("", 8),  # fixed at 8 drafted tokens in llama.cpp
}
# Each type's own parameters (`params`) are rows of the declaration (specfleet/settings.py ARM_PARAMS:
# their bounds llama.cpp's, their flags; declared.TYPE_PARAMS: type -> key -> flag).
# Flags that name what the sweep names elsewhere, or what the agent decides.
MODEL_FLAGS = {"-m", "--model"}
DRAFT_FLAGS = {"-md", "--model-draft", "--spec-draft-model"}
AGENT_FLAGS = {"--port", "--host"}
SPEC_TYPE_FLAG = "--spec-type"


def depth_flag(method: str) -> tuple[str, int]:
    """The flag that carries a llama-server arm's depth, and llama.cpp's default for it; for a
    comma list, its first model-drafted type's (whose --spec-draft-n-max bounds the draft)."""
    types = method.split(",")
    drafted = [t for t in types if t.startswith("draft-")]
    return DEPTH_FLAGS[(drafted or types)[0]]


def flags_of(c, where: str, value) -> tuple[str, ...]:
    """Free server flags from a string (shell words) or a list of strings."""
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError as e:
            c.fail(where, f"is not a valid command line ({e})")
            return ()
    elif isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        words = [str(v) for v in value]
    else:
        c.fail(where, "must be a string of flags or a list of them")
        return ()
    if len(words) > MAX_FLAGS:
        c.fail(where, f"holds {len(words)} words; at most {MAX_FLAGS}")
        return ()
    for word in words:
        if word in MODEL_FLAGS | DRAFT_FLAGS | AGENT_FLAGS | {SPEC_TYPE_FLAG}:
            c.fail(where, f"must not hold {word}: the sweep's models, arms and the agent set it")
        elif word in declared.OWNED_SERVER_FLAGS:
            owner = declared.OWNED_SERVER_FLAGS[word]
            c.fail(where, f"must not hold {word}: it is the sweep setting {owner.sweep} (recorded and compared)")
    return tuple(words)


def parse_server(c, doc: dict[str, Any], engines: list[str]) -> ServerSpec | None:
    """The `server` section: flags shared by every arm, and for openai the system's name and
    its baseline command template or a running server's loopback URL."""
    server = doc.get("server")
    serving = [e for e in engines if e in ("llama-server", "openai")]
    if server is None:
        if "openai" in serving:
            c.fail("server", "is required for engine openai: {system, command} or {system, url}")
        return ServerSpec() if serving else None
    if not isinstance(server, dict):
        c.fail("server", "must be a mapping {flags, system, command, url}")
        return None
    c.unknown_keys("server.", server, SERVER_KEYS)
    if not serving:
        c.fail("server", "applies to engines llama-server and openai only")
    for key in ("system", "command", "url"):
        if key in server and (not isinstance(server[key], str) or not server[key].strip()):
            c.fail(f"server.{key}", "must be a non-empty string")
    spec = ServerSpec(
        flags=flags_of(c, "server.flags", server.get("flags")),
        system=str(server.get("system", "")).strip(),
        command=str(server.get("command", "")).strip(),
        url=str(server.get("url", "")).strip(),
    )
    if "openai" in serving:
        if not spec.system:
            c.fail("server.system", "is required for engine openai: the server's name (MTPLX, OptiQ, oMLX, ...)")
        if bool(spec.command) == bool(spec.url):
            c.fail("server", "engine openai needs exactly one of command (a template) and url (a running server)")
        if spec.command:
            check_template(c, "server.command", spec.command, depth=False)
        if spec.url:
            check_loopback(c, "server.url", spec.url)
    if spec.system in ("specfleet", "llama-server") and "openai" in serving:
        c.fail("server.system", f"{spec.system!r} is not an OpenAI-compatible server's name")
    return spec


def check_template(c, where: str, template: str, depth: bool) -> None:
    for placeholder in ("{port}",) + (("{depth}",) if depth else ()):
        if placeholder not in template:
            c.fail(where, f"the command template has no {placeholder}: the agent picks the port and the arm the depth")
    try:
        template.format(model="m", depth=1, port=1)
    except (KeyError, IndexError, ValueError) as e:
        c.fail(
            where,
            f"the command template has an unknown placeholder or a stray brace ({e!r}); "
            "known: {model}, {depth}, {port}",
        )


def check_loopback(c, where: str, url: str) -> None:
    parsed = urlparse(url)
    if parsed.scheme != "http" or parsed.hostname not in LOOPBACK_HOSTS or not parsed.port:
        c.fail(where, f"{url!r} must be a loopback http URL with a port, e.g. http://127.0.0.1:8000")


def parse_arms(c, doc: dict[str, Any], engine: str, models: dict[str, str], server: ServerSpec | None) -> list[Arm]:
    """A server engine's arms, the baseline first (openai with a running server: its one arm)."""
    raw = doc.get("arms") or []
    if not isinstance(raw, list):
        c.fail("arms", "must be a list of server arms")
        return []
    running = engine == "openai" and server is not None and bool(server.url)
    arms = [] if running else [Arm("baseline")]
    for i, entry in enumerate(raw):
        where = f"arms[{i}]"
        if not isinstance(entry, dict):
            c.fail(where, "must be a mapping")
            continue
        if engine == "llama-server":
            arms += _llama_server_arm(c, where, entry, models)
        else:
            arms += _openai_arm(c, where, entry, running)
    if running and len(arms) != 1:
        c.fail("arms", "a running server (server.url) is one configuration: give exactly one arm with one depth")
    if len(set(arms)) != len(arms):
        c.fail("arms", "lists one server configuration twice")
    return arms


def _depths(c, where: str, entry: dict, default: int, least: int = 1) -> list[int]:
    depths = entry.get("depths", [default])
    if not isinstance(depths, list) or not depths:
        c.fail(f"{where}.depths", "must be a non-empty list of draft depths")
        return []
    return [
        d
        for j, d in enumerate(depths)
        if c.number(f"{where}.depths[{j}]", d, least, MAX_DEPTH, integer=True) is not None
    ]


def build_tag(value) -> str | None:
    """A build as llama.cpp tags its releases ("b9500") from a sweep's value ("b9500", 9500); None
    when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    m = BUILD_RE.match(str(value).strip())
    return f"b{int(m[1])}" if m else None


def _build(c, where: str, entry: dict) -> str:
    if BUILD_FIELD not in entry:
        return ""
    tag = build_tag(entry[BUILD_FIELD])
    if tag is None:
        c.fail(f"{where}.{BUILD_FIELD}", f"must be a llama.cpp build tag such as b9500, got {entry[BUILD_FIELD]!r}")
        return ""
    return tag


def _llama_server_arm(c, where: str, entry: dict, models: dict[str, str]) -> list[Arm]:
    c.unknown_keys(f"{where}.", entry, LLAMA_SERVER_ARM_KEYS)
    build = _build(c, where, entry)
    if "command" in entry:
        if set(entry) - {BUILD_FIELD} != {"command"}:
            c.fail(where, "a command line stands alone: no spec_type, depths, params or flags beside it")
        arm = command_line_arm(c, f"{where}.command", entry["command"], models)
        return [dataclasses.replace(arm, build=build)] if arm else []
    method = entry.get("spec_type")
    if not isinstance(method, str) or not is_method("llama-server", method) or method == "baseline":
        c.fail(
            f"{where}.spec_type",
            f"must be one of {', '.join(SERVER_SPEC_TYPES)} or a comma list of them, got {method!r}",
        )
        return []
    flags = list(flags_of(c, f"{where}.flags", entry.get("flags")))
    params = entry.get("params") or {}
    types = method.split(",")
    allowed = {s.sweep.rpartition(".")[2]: s for s in declared.ARM_PARAMS for t in types if t in s.spec_types}
    if not isinstance(params, dict):
        c.fail(f"{where}.params", "must be a mapping of the type's parameters")
        params = {}
    c.unknown_keys(f"{where}.params.", params, set(allowed))
    for key, value in params.items():
        row = allowed.get(key)
        if row and c.valid(f"{where}.params.{key}", setting_type(row, optional=False), value) is not None:
            flags += [row.server_flags[0], str(value)]
    if "draft-simple" in method.split(",") and not models.get("draft"):
        c.fail(f"{where}.spec_type", "draft-simple needs models.llama-server.draft")
    least = least_depth("llama-server", method)  # draft types: n_max 0 loads the drafter, an arm of its own
    return [Arm(method, d, tuple(flags), build=build) for d in _depths(c, where, entry, depth_flag(method)[1], least)]


def command_line_arm(c, where: str, line, models: dict[str, str]) -> Arm | None:
    """An arm from a whole llama-server command line as the seeds write one."""
    if not isinstance(line, str):
        c.fail(where, "must be a command line")
        return None
    try:
        words = shlex.split(line)
    except ValueError as e:
        c.fail(where, f"is not a valid command line ({e})")
        return None
    if not words or PurePosixPath(words[0]).name != "llama-server":
        c.fail(where, "must begin with llama-server")
        return None
    method, depth, flags = "baseline", None, []
    values = iter(words[1:])
    for word in values:
        if word in MODEL_FLAGS | DRAFT_FLAGS | AGENT_FLAGS | {SPEC_TYPE_FLAG} or word in _depth_flag_names():
            value = next(values, None)
            if value is None:
                c.fail(where, f"{word} needs a value")
                return None
            if word in MODEL_FLAGS | DRAFT_FLAGS:
                role = "target" if word in MODEL_FLAGS else "draft"
                if PurePosixPath(value).name != PurePosixPath(models.get(role, "")).name:
                    c.fail(
                        where,
                        f"{word} {value} is not the sweep's {role} model ({models.get(role) or 'none'}): "
                        "arms of one job compare one model (name it in models)",
                    )
            elif word == SPEC_TYPE_FLAG:
                method = value
            elif word in _depth_flag_names():
                least = 0 if word == "--spec-draft-n-max" else 1
                if not value.isdigit() or not least <= int(value) <= MAX_DEPTH:
                    c.fail(where, f"{word} {value}: must be a depth from {least} to {MAX_DEPTH}")
                    return None
                depth = int(value)
        else:
            flags.append(word)
    if method != "baseline" and not is_method("llama-server", method):
        c.fail(where, f"--spec-type {method!r} is not one of {', '.join(SERVER_SPEC_TYPES)}")
        return None
    if method == "baseline":
        if depth is not None:
            c.fail(where, "a depth flag without --spec-type")
        return Arm("baseline", 0, tuple(flags))
    if depth is not None and depth < least_depth("llama-server", method):
        c.fail(where, f"--spec-type {method} drafts at depth 1 to {MAX_DEPTH}, got {depth}")
        return None
    return Arm(method, depth if depth is not None else depth_flag(method)[1], tuple(flags))


def _depth_flag_names() -> set[str]:
    return {flag for flag, _ in DEPTH_FLAGS.values() if flag}


def _openai_arm(c, where: str, entry: dict, running: bool) -> list[Arm]:
    c.unknown_keys(f"{where}.", entry, OPENAI_ARM_KEYS)
    method = entry.get("method")
    if method not in OPENAI_METHODS or method == "baseline":
        c.fail(
            f"{where}.method",
            f"must be one of {', '.join(m for m in OPENAI_METHODS if m != 'baseline')}: what the server does",
        )
        return []
    command = entry.get("command", "")
    if running:
        if command:
            c.fail(f"{where}.command", "a running server (server.url) takes no command")
    elif not isinstance(command, str) or not command.strip():
        c.fail(f"{where}.command", "is required: the server's command template for this arm")
        return []
    else:
        check_template(c, f"{where}.command", command, depth=len(entry.get("depths", [1]) or [1]) > 1)
    return [
        Arm(method, d, (), command.strip() if isinstance(command, str) else "") for d in _depths(c, where, entry, 1)
    ]


def by_build(arms: list[Arm]) -> list[tuple[str, list[Arm]]]:
    """A server engine's arms as cells by pinned build, in the order the builds first appear:
    (build, its arms with the build taken off: the cell's ServerSpec carries it). Baselines pinned
    to no build join every cell; arms pinned to none make the cell of build "" (the agent's own
    llama-server). Without a pin, one cell of every arm, as before builds could be pinned."""
    shared = [a for a in arms if a.method == "baseline" and not a.build]
    builds = list(dict.fromkeys(a.build for a in arms if a not in shared)) or [""]
    cells = []
    for build in builds:
        own = [dataclasses.replace(a, build="") for a in arms if a.build == build and a not in shared]
        cells.append((build, list(dict.fromkeys(shared + own))))
    return cells


def fingerprint_builds(engine_versions: dict[str, str]) -> dict[str, str]:
    """The llama-server builds an agent reports in its fingerprint's engine versions: tag ->
    version label."""
    return {k[len(BUILD_KEY_PREFIX) :]: v for k, v in engine_versions.items() if k.startswith(BUILD_KEY_PREFIX)}


def notes(engine: str, arms: list[Arm]) -> list[str]:
    """What the submitter should know about a server engine's arms."""
    out = []
    if engine == "llama-server":
        shared = {a.flags for a in arms if a.method == "baseline"}
        others = {a.flags for a in arms} - shared
        if others and any(_free(f) != _free(next(iter(shared), ())) for f in others):
            out.append(
                "llama-server: arms differ in flags besides speculation "
                "(compare the baseline with the same -c, -fa, -ngl, --parallel): "
                + "; ".join(f"{a.method}: {' '.join(a.flags) or '(none)'}" for a in arms)
            )
    if engine == "openai" and not any(a.method == "baseline" for a in arms):
        out.append("openai: a running server is one arm: its runs give no speedup without a baseline job")
    return out


def _free(flags: tuple[str, ...]) -> tuple[str, ...]:
    """Flags other than the spec types' own parameters."""
    spec = {f for params in declared.TYPE_PARAMS.values() for f in params.values()}
    out, skip = [], False
    for word in flags:
        if skip:
            skip = False
        elif word in spec:
            skip = True
        else:
            out.append(word)
    return tuple(out)


def recorded_flags(command: str) -> str:
    """A server's command line (or command template) as recorded flags: without the binary
    (its version is recorded apart), the model paths, host and port (with a template's
    placeholders), which differ between machines and runs without changing what is measured; the
    rest in its order. RunRecord's settings.server_flags (a checked key) holds this of what every
    arm's server of a job shares."""
    try:
        words = shlex.split(command)[1:]
    except ValueError:
        return command
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in MODEL_FLAGS | DRAFT_FLAGS | AGENT_FLAGS:
            skip = True
        elif not word.startswith(tuple(f"{f}=" for f in MODEL_FLAGS | DRAFT_FLAGS | AGENT_FLAGS)):
            out.append(word)
    return shlex.join(out)
