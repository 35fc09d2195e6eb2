"""Before a job reaches a worker the agent checks it: an engine and methods it knows, model paths
inside its model directories, models that fit in memory and whose weights it can read (their
identity: agent/model_identity.py), a context the model can hold. A job that fails the check is
refused (FailJob refused=True, never retried) with the reason."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agent.model_identity import ModelUnreadable, identify
from agent.models import ModelRefused, check_fits, resolve
from specfleet.record import ENGINE_METHODS, ENGINES, JobSpec, ModelIdentity, is_method

if TYPE_CHECKING:
    from agent.parts import AgentParts as Agent


GGUF_MAGIC = b"GGUF"


def _magic(path: Path) -> bytes:
    """A file's first four bytes; b"" for a directory or an unreadable file."""
    try:
        with path.open("rb") as f:
            return f.read(4)
    except OSError:
        return b""


def format_problem(engine: str, path: Path) -> str:
    """Why `path` is a model in the wrong format for `engine` ("" when it is not): MLX loads a
    model directory (config.json and safetensors), the llama.cpp engines one GGUF file. One line,
    instead of the worker's traceback."""
    is_gguf = _magic(path) == GGUF_MAGIC
    if engine == "mlx" and is_gguf:
        return (
            "is a GGUF file; the mlx engine loads an MLX model directory (config.json and safetensors): "
            "convert it with `specfleet models gguf-to-mlx`, or run it on the llama.cpp engines"
        )
    if engine == "mlx" and not (path / "config.json").is_file():
        return "is not an MLX model directory (no config.json); the mlx engine loads config.json and safetensors"
    if engine in ("llama.cpp", "llama-server") and not is_gguf:
        what = "a directory" if path.is_dir() else "not a GGUF file (no GGUF magic)"
        return f"is {what}; the {engine} engine loads one GGUF file"
    return ""


def check(agent: Agent, spec: JobSpec) -> tuple[JobSpec, dict[str, ModelIdentity]]:
    """(spec with local model paths, the models' identities); ModelRefused with the reason this
    agent will not run the job."""
    if spec.engine not in ENGINES or spec.engine not in agent.engines:
        raise ModelRefused(
            f"engine {spec.engine!r} is not one this agent runs (it runs: {', '.join(agent.engines) or 'none'})"
        )
    build = spec.server.build if spec.server is not None else ""
    if build and build not in agent.llama_builds:
        have = ", ".join(f"{b.tag} ({b.binary})" for b in agent.llama_builds.values()) or "none"
        raise ModelRefused(f"the job pins llama-server build {build}, which this agent does not have (it has: {have})")
    unknown = sorted({a.method for a in spec.arms if not is_method(spec.engine, a.method)}, key=str)
    if unknown:
        raise ModelRefused(
            f"method(s) {', '.join(map(repr, unknown))} unknown to engine {spec.engine} on this agent "
            f"(it knows: {', '.join(ENGINE_METHODS[spec.engine])})"
        )
    roles = [r for r in ("target", "draft") if spec.model.get(r)]
    if "target" not in roles:
        raise ModelRefused("the job names no target model")
    dirs, downloads = list(agent.config.model_dirs), agent.config.allow_downloads
    resolved = {r: resolve(spec.model[r], dirs, downloads, agent.hf_cache) for r in roles}
    for role, model in resolved.items():
        if problem := format_problem(spec.engine, model.path):
            raise ModelRefused(f"{role} {model.reference}: {problem}")
    check_fits(list(resolved.values()), agent.fingerprint.memory_bytes, spec.memory_gb or None)
    try:
        identities = {r: identify(m, agent.hashes.digest(m)) for r, m in resolved.items()}
    except ModelUnreadable as e:
        raise ModelRefused(str(e)) from None
    limit = identities["target"].context_length
    if limit and spec.context_tokens + spec.max_new_tokens > limit:
        raise ModelRefused(
            f"context of {spec.context_tokens} tokens and {spec.max_new_tokens} new tokens is longer than "
            f"{identities['target'].reference}'s own context length of {limit} tokens"
        )
    return spec.with_models(**{r: str(m.path) for r, m in resolved.items()}), identities
