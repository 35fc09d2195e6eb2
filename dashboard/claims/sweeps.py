"""The sweep file that would test a claim, on the claim's own system, with our loop of the same
method as a second engine where there is one."""

from __future__ import annotations

from typing import Any

import yaml

from dashboard.claims.claim import (
    DECLARED_CONDITIONS,
    LLAMA_SERVER,
    MAC_FAMILIES,
    OURS,
    SERVER_PRESETS,
    SWEEP_REPEATS,
    Claim,
    _as_list,
    our_loop,
)
from specfleet import server_arms
from specfleet.record import IN_PROCESS_ENGINES, SERVER_SPEC_TYPES


def _sweep_settings(claim: Claim) -> dict[str, Any]:
    """The sweep fields of the declared settings the claim names (specfleet/settings.py `sweep`,
    dotted: "spec_draft.n_min" -> {spec_draft: {n_min: ...}}): the sweep varies exactly them."""
    out: dict[str, Any] = {}
    for name, setting in DECLARED_CONDITIONS.items():
        value = claim.conditions.get(name)
        if value is None or not setting.sweep:
            continue
        *parents, leaf = setting.sweep.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        values = _as_list(value)
        node[leaf] = values if len(values) > 1 else values[0]
    return out


def sweep_depths(claim: Claim) -> list[int]:
    """The depths a claim's sweep measures: the claim's own, or for a claim of any depth the
    method's default (llama.cpp's: --spec-draft-n-max 3, ngram-mod's n_max 64, ...; 3 for
    our other loops)."""
    if claim.depths:
        return claim.depths
    types = claim.method.split(",")
    return [server_arms.depth_flag(claim.method)[1] if all(t in SERVER_SPEC_TYPES for t in types) else 3]


def _needs_draft(method: str) -> bool:
    return method in ("draft", "ref-draft") or "draft-simple" in method.split(",")


def sweep_yaml(claim: Claim) -> str:
    """A sweep file that measures the claim's arm against the baseline on the claim's own
    system and chips: in-process methods for our loops, llama-server arms (`spec_type` and its
    depths, with the source's server flags), or an OpenAI-compatible server's command templates
    (SERVER_PRESETS, or the claim's sweep.command and sweep.arm_command). A claim about
    another system gets our loop of the same method on the same weights as the file's second
    engine (our_loop), whose runs stand beside the verdict."""
    c = claim.conditions
    engine, method = claim.engine, claim.method
    depths = sweep_depths(claim)
    named = (c.get("models") or ["target"])[0].split("/")[-1]
    gguf = engine in ("llama.cpp", LLAMA_SERVER) and not named.endswith(".gguf")
    target = claim.sweep.get("target") or "/models/" + named + (".gguf" if gguf else "")
    models = {"target": target}
    if _needs_draft(method):
        models["draft"] = claim.sweep.get("draft") or target + "-draft"
    ours = our_loop(claim)
    engines = [engine] + ([ours.engine] if ours else [])
    notes = []
    doc: dict[str, Any] = {"name": f"claim-{claim.id}"}
    chip = c.get("chip")
    if chip == "Apple*":
        doc["target"] = {"chip_families": list(MAC_FAMILIES)}
    elif chip and not chip.endswith("*"):
        doc["target"] = {"chips": [chip]}
    if c.get("memory_gb") is not None:  # a machine's memory is measured, not set: the sweep targets it
        doc.setdefault("target", {})["min_memory_gb"] = min(_as_list(c["memory_gb"]))
    by_engine: dict[str, Any] = {e: dict(models) for e in engines}
    if claim.baseline_models:  # the source's baseline files: their cells run the baseline alone
        gguf_dir = target.rsplit("/", 1)[0] if "/" in target else "/models"
        by_engine[engine] = [dict(models)] + [
            {"target": f"{gguf_dir}/{name}", "baseline_only": True} for name in claim.baseline_models
        ]
        notes.append(f"the baseline is the source's, on {', '.join(claim.baseline_models)} (baseline_only)")
    doc.update(
        models=by_engine,
        engines=engines,
        samplers=[dict(c.get("sampler") or {"temperature": 0})],
        prompt_sets=[c.get("prompt_set") or (_as_list(c.get("prompt_category")) or ["conversation"])[0]],
    )
    in_process = claim if engine in IN_PROCESS_ENGINES else ours
    if in_process is not None:
        doc["methods"] = {in_process.method: list(depths)}
        if in_process.method in ("ngram", "ref-ngram"):
            doc["ngram"] = {"n_min": 1, "n_max": 3}
    if engine == LLAMA_SERVER:
        if claim.sweep.get("flags"):
            doc["server"] = {"flags": claim.sweep["flags"]}
            notes.append(f"llama-server's flags are the source's: {claim.sweep['flags']}")
        doc["arms"] = [{"spec_type": method, "depths": list(depths)}]
    elif engine == "openai":
        preset = SERVER_PRESETS.get(claim.system, {})
        arm = claim.sweep.get("arm_command") or preset[method]  # sets {depth}: the ledger checks it
        doc["server"] = {"system": claim.system, "command": claim.sweep.get("command") or preset["baseline"]}
        doc["arms"] = [{"method": method, "depths": list(depths), "command": arm}]
    doc.update(_sweep_settings(claim))
    # Warm-up as every sweep's default (JobSpec.warmup: until two runs agree within 5%, at most 10).
    doc.update(max_new_tokens=claim.sweep.get("max_new_tokens", 256), repeats=SWEEP_REPEATS)
    header = f"# Tests claim {claim.id}: {claim.statement}\n"
    if claim.system != OURS:
        header += f"# The claim is about {claim.label}: only its runs settle it.\n"
    if ours is not None:
        header += (
            f"# Engine {ours.engine} runs our loop of the same method on the same weights ({ours.label}):"
            " shown beside the verdict, never as it.\n"
        )
    header += "".join(f"# {n}.\n" for n in notes)
    header += "# Point models at your files, then: specfleet sweep submit FILE\n"
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)
