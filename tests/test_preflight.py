"""agent/preflight.check as a function, on the tiny models' files (headers only: nothing loads): each
reason a job is refused before it reaches a worker, and what an accepted job comes back as.
The agent's daemon tests (tests/test_agent_daemon.py) see the same refusals through real processes."""

import shutil
from types import SimpleNamespace

import pytest

from agent import preflight
from agent.models import HashCache, ModelRefused
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.record import Arm, JobSpec, Prompt


def agent(tmp_path, model_dirs, engines=("mlx", "llama.cpp"), memory_bytes=16 * 2**30):
    """What check() reads of an agent: its engines, model directories, memory and digest cache."""
    return SimpleNamespace(
        engines=list(engines),
        config=SimpleNamespace(model_dirs=tuple(model_dirs), allow_downloads=False),
        hf_cache=None,
        fingerprint=pb.Fingerprint(memory_bytes=memory_bytes),
        hashes=HashCache(tmp_path / "hashes.json"),
    )


ARMS = (Arm("baseline"), Arm("draft", 2))


def job(target, draft=None, engine="mlx", arms=ARMS, **fields) -> JobSpec:
    model = {"target": str(target), **({"draft": str(draft)} if draft else {})}
    values = dict(prompt_set="code", prompt_category="code", prompt_set_digest="cd" * 32)
    values.update(fields)
    return JobSpec(engine=engine, model=model, prompts=(Prompt("p1", "hello"),), arms=arms, **values)


@pytest.fixture
def models(tmp_path, tiny_models):
    """The tiny target and draft in both formats, copied into one model directory."""
    directory = tmp_path / "models"
    directory.mkdir()
    for path in (tiny_models.mlx_target, tiny_models.mlx_draft):
        shutil.copytree(path, directory / path.name)
    shutil.copy(tiny_models.gguf_target, directory)
    return directory


def test_an_accepted_job_comes_back_with_local_paths_and_both_identities(tmp_path, models, tiny_models):
    spec, identities = preflight.check(agent(tmp_path, [models]), job(models / "target", models / "draft"))
    assert spec.model == {"target": str(models / "target"), "draft": str(models / "draft")}
    assert set(identities) == {"target", "draft"}
    assert identities["target"].architecture == "LlamaForCausalLM" and len(identities["target"].digest) == 64
    assert identities["target"].digest != identities["draft"].digest
    # The digest follows the weights, not where they lie: the original files give the same.
    _, elsewhere = preflight.check(agent(tmp_path, [tiny_models.mlx_target.parent]), job(tiny_models.mlx_target))
    assert elsewhere["target"].digest == identities["target"].digest


@pytest.mark.parametrize(
    "engines, spec_fields, reason",
    [
        (("llama.cpp",), {}, "engine 'mlx' is not one this agent runs (it runs: llama.cpp)"),
        ((), {}, "(it runs: none)"),
        (("mlx",), {"arms": (Arm("baseline"), Arm("draft-mtp", 2))}, "method(s) 'draft-mtp' unknown to engine mlx"),
    ],
)
def test_engine_and_methods_the_agent_does_not_run_are_refused_by_name(tmp_path, models, engines, spec_fields, reason):
    with pytest.raises(ModelRefused, match=reason.replace("(", r"\(").replace(")", r"\)")):
        preflight.check(agent(tmp_path, [models], engines), job(models / "target", **spec_fields))


def test_a_job_without_a_target_is_refused(tmp_path, models):
    spec = job(models / "target").with_models(target="")
    with pytest.raises(ModelRefused, match="names no target model"):
        preflight.check(agent(tmp_path, [models]), spec)


def test_a_model_outside_the_model_directories_is_refused(tmp_path, models, tiny_models):
    with pytest.raises(ModelRefused, match="outside this agent's model directories"):
        preflight.check(agent(tmp_path, [models]), job(tiny_models.mlx_target))


def test_models_larger_than_memory_are_refused_before_anything_loads(tmp_path, models):
    with pytest.raises(ModelRefused, match="memory"):
        preflight.check(agent(tmp_path, [models], memory_bytes=1024), job(models / "target"))


def test_unreadable_weights_are_refused_with_the_reason(tmp_path, models):
    bad = models / "garbage.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelRefused, match="garbage.gguf"):
        preflight.check(
            agent(tmp_path, [models], engines=("llama.cpp",)), job(bad, engine="llama.cpp", arms=(Arm("baseline"),))
        )


def test_a_context_longer_than_the_model_holds_is_refused(tmp_path, models):
    spec = job(models / "target", context_tokens=1_000_000, max_new_tokens=32)
    with pytest.raises(ModelRefused, match="longer than target's own context length of"):
        preflight.check(agent(tmp_path, [models]), spec)


@pytest.mark.parametrize(
    "engine, name, reason",
    [
        ("mlx", "target.gguf", r"^target .*target.gguf: is a GGUF file; the mlx engine loads an MLX model directory"),
        ("llama.cpp", "target", r"^target .*target: is a directory; the llama.cpp engine loads one GGUF file$"),
        ("llama.cpp", "notes.gguf", r"is not a GGUF file \(no GGUF magic\); the llama.cpp engine loads one GGUF file"),
    ],
)
def test_a_model_in_the_wrong_format_for_its_engine_is_refused_in_one_line(tmp_path, models, engine, name, reason):
    (models / "notes.gguf").write_text("not a model")
    with pytest.raises(ModelRefused, match=reason) as e:
        preflight.check(agent(tmp_path, [models]), job(models / name, engine=engine, arms=(Arm("baseline"),)))
    assert "\n" not in str(e.value)
