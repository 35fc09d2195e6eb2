"""Sweep files: every malformed one is refused with its line, the field and the reason."""

import re

import pytest

from specfleet import prompt_library
from specfleet.record import Arm, JobSpec, Sampler, VerifyCost
from specfleet.sweeps import MAX_MESSAGE_CHARS, MAX_PROBLEM_CHARS, TOP_KEYS, SweepError, agent_matches, parse_sweep
from specfleet.yaml_limits import MAX_NODES
from tests.support.fleet import SWEEP_YAML
from tests.support.sweeps import alias_bomb, yaml_of


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: [unclosed", "file: not valid YAML"),
        ("- a\n- b\n", "file: must be a mapping"),
        (yaml_of(name=None), "name: is required"),
        (yaml_of(name="has space"), "name: is required"),
        (yaml_of(colour="blue"), "colour: unknown field"),
        (yaml_of(engines=["vllm"]), "engines: unknown engine 'vllm'"),
        (yaml_of(engines=[]), "engines: is required"),
        (yaml_of(engines=["mlx", "mlx"]), "engines: lists an engine twice"),
        (yaml_of(models={}), "models.mlx.target: is required"),
        (yaml_of(models={"mlx": {"target": "/m/t", "weights": "x"}}), "models.mlx.weights: unknown field"),
        (yaml_of(models={"mlx": {"target": "/m/t"}}, methods={"draft": [2]}), "models.mlx.draft: is required"),
        (yaml_of(models={"mlx": {"target": "/m/t", "memory_gb": -4}}), "models.mlx.memory_gb: must be at least 0,"),
        (yaml_of(models={"mlx": {"target": "/m/t", "memory_gb": "8G"}}), "models.mlx.memory_gb: must be a number"),
        (yaml_of(methods={"medusa": [2]}), "methods.medusa: unknown method"),
        (yaml_of(methods={"ref-ngram": [3]}), "methods.ref-ngram: not supported by mlx"),
        (yaml_of(methods={"ref-baseline": [2]}), "methods.ref-baseline[0]: must be at most 0, got 2"),
        (yaml_of(verify_cost={"context_tokens": [-1]}), "verify_cost.context_tokens[0]: must be at least 0, got -1"),
        (yaml_of(verify_cost={"max_rows": 100}), "verify_cost.max_rows: must be at most 64, got 100"),
        (yaml_of(verify_cost={"rows": 8}), "verify_cost.rows: unknown field"),
        (yaml_of(verify_cost=[128]), "verify_cost: must be a mapping"),
        (yaml_of(methods={"draft": [0]}), "methods.draft[0]: must be at least 1, got 0"),
        (yaml_of(methods={"draft": [99]}), "methods.draft[0]: must be at most 64, got 99"),
        (yaml_of(methods={"draft": ["two"]}), "methods.draft[0]: must be an integer"),
        (yaml_of(methods={"draft": [2, 2]}), "methods: lists a depth twice"),
        (yaml_of(methods={"draft": []}), "methods.draft: must be a non-empty list"),
        (yaml_of(samplers=[{"temperature": -1}]), "samplers[0].temperature: must be at least 0, got -1"),
        (yaml_of(samplers=[{"top_p": 0}]), "samplers[0].top_p: must be at least 0.0001, got 0"),
        (yaml_of(samplers=[{"temp": 0.7}]), "samplers[0].temp: unknown field"),
        (yaml_of(prompt_sets=["poetry"]), "prompt_sets: unknown prompt set 'poetry'"),
        (yaml_of(max_new_tokens=0), "max_new_tokens: must be at least 1, got 0"),
        (yaml_of(max_new_tokens=10**9), "max_new_tokens: must be at most 16384, got 1000000000"),
        (yaml_of(repeats=True), "repeats: must be an integer"),
        (yaml_of(repeats=2.5), "repeats: must be an integer"),
        (yaml_of(ngram={"n_min": 4, "n_max": 2}), "ngram: n_min (4) must not exceed n_max (2)"),
        (yaml_of(target={"min_memory_gb": "lots"}), "target.min_memory_gb: must be a number"),
        (yaml_of(target={"gpu": "big"}), "target.gpu: unknown field"),
        (".nan", "file: must be a mapping"),
        ("name: s\n" + "x" * 300_000, "file: larger than"),
    ],
)
def test_malformed_sweeps_name_the_field(text, message):
    with pytest.raises(SweepError) as e:
        parse_sweep(text)
    assert message in str(e.value)
    problem = next(p for p in e.value.problems if message in p)
    if not message.startswith("file:"):  # the file as a whole: no line of its own
        line = re.match(r"line (\d+): ", problem)  # which line: test_every_kind_of_mistake_names_its_line
        assert line and 1 <= int(line[1]) <= len(text.splitlines()), problem


# Every kind of mistake, each on a line of its own: the problem names that line.
MISTAKES = """\
name: lines
engines: [mlx, llama-server, vllm]
prompt_sets: [code, poetry]
models:
  mlx: {target: /m/t}
  llama-server:
    target: /m/t.gguf
    memory_gb: lots
    weights: x
samplers:
  - {temperature: 0.5}
  - temperature: -1
    top_k: 2.5
methods:
  ngram:
    - 3
    - 99
  medusa: [2]
ngram_mod:
  n_match: [8, 0]
kv_cache_type: q9
verify_cost:
  max_rows: 100
arms:
  - spec_type: ngram-mod
    depths: [2,
      0]
repeats: 0
target: {gpu: big, min_memory_gb: -1}
colour: blue
"""


def test_every_kind_of_mistake_names_its_line():
    with pytest.raises(SweepError) as e:
        parse_sweep(MISTAKES, "sweep.yaml")
    problems = sorted(e.value.problems, key=lambda p: (int(p.split(":")[1]), p))
    assert problems[:-1] == [
        "sweep.yaml:2: engines: unknown engine 'vllm' (known: mlx, llama.cpp, llama-server, openai)",
        "sweep.yaml:3: prompt_sets: unknown prompt set 'poetry' (known: "
        + ", ".join(prompt_library.prompt_sets())
        + ")",
        "sweep.yaml:8: models.llama-server.memory_gb: must be a number, got 'lots'",
        "sweep.yaml:9: models.llama-server.weights: unknown field (allowed: baseline_only, draft, memory_gb, target)",
        "sweep.yaml:12: samplers[1].temperature: must be at least 0, got -1",
        "sweep.yaml:13: samplers[1].top_k: must be an integer, got 2.5",
        "sweep.yaml:17: methods.ngram[1]: must be at most 64, got 99",
        "sweep.yaml:18: methods.medusa: unknown method (known: baseline, "
        + ", ".join(
            m for m in ("draft", "ngram", "mtp", "ngram-mod", "ngram-map-k4v", "ref-baseline", "ref-draft", "ref-ngram")
        )
        + ")",
        "sweep.yaml:20: ngram_mod.n_match[1]: must be at least 1, got 0",
        "sweep.yaml:21: kv_cache_type: must be one of f32, f16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1, got 'q9'",
        "sweep.yaml:23: verify_cost.max_rows: must be at most 64, got 100",
        "sweep.yaml:27: arms[0].depths[1]: must be at least 1, got 0",
        "sweep.yaml:28: repeats: must be at least 1, got 0",
        "sweep.yaml:29: target.gpu: unknown field (allowed: agents, chip_families, chips, labels, min_memory_gb)",
        "sweep.yaml:29: target.min_memory_gb: must be at least 0, got -1",
    ]
    assert (
        problems[-1]
        == ("sweep.yaml:30: colour: unknown field (allowed: " + ", ".join(sorted(TOP_KEYS)))[: MAX_PROBLEM_CHARS - 3]
        + "..."
    )  # cut to MAX_PROBLEM_CHARS
    with pytest.raises(SweepError) as e:
        parse_sweep(MISTAKES)  # no file name: the line alone
    assert any(p.startswith("line 2: engines: unknown engine 'vllm'") for p in e.value.problems)
    assert "sweep.yaml" not in str(e.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(SweepError) as e:
        parse_sweep(yaml_of(engines=["vllm"], repeats=0, prompt_sets=["poetry"]))
    assert len(e.value.problems) == 3


def test_a_good_sweep_expands_into_cells_with_baseline_first():
    sweep = parse_sweep(SWEEP_YAML)
    cells = sweep.cells()
    assert len(cells) == 1
    assert cells[0].arms == (Arm("baseline", 0), Arm("draft", 2))
    assert len(cells[0].prompts) == 2 and all(p.text for p in cells[0].prompts)  # `prompts: 2`
    assert cells[0].sampler == Sampler(temperature=0.0, top_p=1.0, top_k=0, seed=0)
    assert cells[0].prompt_category == "code" and len(cells[0].prompt_set_digest) == 64
    assert cells[0].context_tokens == 0 and cells[0].documents == ()
    # The spec survives its JSON unchanged: what the agent reads is what the coordinator wrote.
    assert JobSpec.from_json(cells[0].to_json()) == cells[0]


def test_context_depth_is_a_cell_dimension_with_its_own_documents_and_digest():
    sweep = parse_sweep(SWEEP_YAML + "context_tokens: [0, 512, 4096]\n")
    cells = sweep.cells()
    assert [c.context_tokens for c in cells] == [0, 512, 4096]
    assert cells[0].documents == () and 0 < len(cells[1].documents) <= len(cells[2].documents)
    assert len({c.prompt_set_digest for c in cells}) == 3  # different text read, different digest
    assert sum(map(len, cells[2].documents)) >= 4096 * 8 or cells[2].documents == prompt_library.documents()
    with pytest.raises(SweepError, match="context_tokens\\[1\\]: must be at "):
        parse_sweep(SWEEP_YAML + "context_tokens: [0, 1000000]\n")
    with pytest.raises(SweepError, match="context_tokens: lists a depth twice"):
        parse_sweep(SWEEP_YAML + "context_tokens: [512, 512]\n")


def test_repeats_are_rounded_up_to_complete_the_williams_design_and_the_sweep_says_so():
    sweep = parse_sweep(SWEEP_YAML.replace("repeats: 1", "repeats: 3").replace("{draft: [2]}", "{draft: [2, 4]}"))
    assert sweep.notes() == [
        "mlx: repeats rounded up from 3 to 6 to complete the Williams design of 3 arms "
        "(each arm follows every other equally often)"
    ]
    assert parse_sweep(SWEEP_YAML.replace("repeats: 1", "repeats: 4")).notes() == []  # 2 arms: 2 rows


def test_each_engine_gets_only_the_arms_it_has():
    sweep = parse_sweep(
        yaml_of(
            engines=["mlx", "llama.cpp"],
            models={"mlx": {"target": "/t", "draft": "/d"}, "llama.cpp": {"target": "/t.gguf", "draft": "/d.gguf"}},
            methods={"ref-draft": [2], "ref-ngram": [3], "ngram": [3]},
            verify_cost={"context_tokens": [64, 256]},
        )
    )
    arms = {c.engine: [(a.method, a.depth) for a in c.arms] for c in sweep.cells()}
    assert arms["mlx"] == [("baseline", 0), ("ngram", 3), ("ref-draft", 2)]
    assert arms["llama.cpp"] == [("baseline", 0), ("ngram", 3), ("ref-ngram", 3)]
    assert sweep.cells()[0].verify_cost == VerifyCost(context_tokens=(64, 256), max_rows=16, repeats=5)


def test_a_baseline_only_model_runs_the_baseline_arm_alone():
    """A claim's source measured its baseline on another file (the bug report's non-MTP GGUF):
    that pair's cells run the baseline alone, with no verify-cost rows."""
    models = [{"target": "/t-mtp"}, {"target": "/t-plain", "baseline_only": True}]
    sweep = parse_sweep(yaml_of(models={"mlx": models}, methods={"mtp": [2]}, verify_cost={"context_tokens": [64]}))
    cells = {c.model["target"]: c for c in sweep.cells()}
    assert [(a.method, a.depth) for a in cells["/t-mtp"].arms] == [("baseline", 0), ("mtp", 2)]
    assert [(a.method, a.depth) for a in cells["/t-plain"].arms] == [("baseline", 0)]
    assert cells["/t-mtp"].verify_cost is not None and cells["/t-plain"].verify_cost is None
    assert "baseline_only" not in cells["/t-plain"].model  # a sweep's field, not the agent's
    with pytest.raises(SweepError, match=r"models.mlx\[1\].baseline_only: must be true or false"):
        parse_sweep(yaml_of(models={"mlx": [{"target": "/t"}, {"target": "/u", "baseline_only": "yes"}]}))


@pytest.mark.parametrize(
    "target, matches",
    [
        ({}, True),
        ({"chip_families": ["M4 Pro"]}, True),
        ({"chip_families": ["M4"]}, True),
        ({"chip_families": ["M1"]}, False),
        ({"chips": ["Apple M4 Max"]}, False),
        ({"min_memory_gb": 64}, False),
        ({"labels": {"room": "lab"}}, True),
        ({"labels": {"room": "home"}}, False),
        ({"agents": ["other"]}, False),
    ],
)
def test_target_selector(target, matches):
    agent = {"name": "mini", "chip": "Apple M4 Pro", "memory_bytes": 48 * 2**30, "labels": {"room": "lab"}}
    assert agent_matches(target, agent) is matches


def test_the_readme_sweep_example_is_accepted():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    running = (root / "docs" / "running.md").read_text()
    example = running.split("## A sweep file")[1].split("```yaml")[1].split("```")[0]
    sweep = parse_sweep(example)
    assert {("mtp", 3), ("draft", 4), ("ngram", 3)} <= {(a.method, a.depth) for a in sweep.arms}
    assert sweep.context_tokens == [512, 4096, 16384, 32768]
    short = parse_sweep((root / "README.md").read_text().split("```yaml")[1].split("```")[0])  # README's own
    assert {("mtp", 3), ("draft", 4), ("ngram", 3)} <= {(a.method, a.depth) for a in short.arms}


@pytest.mark.parametrize(
    "text, message",
    [
        (alias_bomb(), f"file: line 4: more than {MAX_NODES} values with every alias expanded"),
        ("name: s\nrepeats:\n" + "- " * 20_000 + "1\n", "file: line 3: nested deeper than 32 levels"),
        ("name: s\nrepeats: " + "[" * 20_000 + "]" * 20_000 + "\n", "file: not valid YAML"),
        ("name: s\nrepeats: &r [*r]\n", "file: line 2: alias *r refers to no complete node"),
        (
            yaml_of() + "repeats: 2\nrepeats: 3\n",
            f"file: line {len(yaml_of().splitlines()) + 2}: key 'repeats' is given twice",
        ),
        (yaml_of(models={"mlx": {"target": "/t"}}).replace("target: /t", "target: /t\n    target: /u"), "key 'target'"),
    ],
)
def test_yaml_past_the_limits_is_refused_at_once_naming_the_line(text, message):
    with pytest.raises(SweepError) as e:
        parse_sweep(text)
    assert message in str(e.value)


def test_an_alias_bomb_costs_milliseconds():
    import time

    start = time.perf_counter()
    with pytest.raises(SweepError):
        parse_sweep(alias_bomb(levels=12))
    assert time.perf_counter() - start < 0.5


def test_aliases_within_the_limits_still_share_a_value():
    sweep = parse_sweep(yaml_of() + "samplers: [&s {temperature: 0.7, seed: 1}, *s]\n")
    assert len(sweep.samplers) == 2 and sweep.samplers[0] == sweep.samplers[1] == Sampler(0.7, 1.0, 0, 1)


def test_an_error_message_stays_small_enough_for_grpc_metadata():
    huge = yaml_of(repeats=list(range(4000)), warmup="w" * 100_000, prompt_sets=[f"s{i}" for i in range(500)])
    with pytest.raises(SweepError) as e:
        parse_sweep(huge)
    assert len(str(e.value)) <= MAX_MESSAGE_CHARS
    assert "prompt_sets: unknown prompt set 's0'" in str(e.value) and "more problem(s)" in str(e.value)
    assert any(re.match(r"line \d+: repeats: must be an integer, got \[0, 1, 2", p) for p in e.value.problems)
    assert all(len(p) <= MAX_PROBLEM_CHARS for p in e.value.problems)


def test_a_line_is_found_through_dotted_keys_flow_style_and_aliases():
    text = (
        "name: s\n"
        "engines: [mlx, llama.cpp]\n"
        "prompt_sets: [code]\n"
        "pair: &pair {target: /t.gguf, memory_gb: -1}\n"
        "models:\n"
        "  mlx: {target: /t,\n"
        "        memory_gb: big}\n"
        "  llama.cpp: *pair\n"
    )
    with pytest.raises(SweepError) as e:
        parse_sweep(text)
    assert set(e.value.problems) >= {
        "line 7: models.mlx.memory_gb: must be a number, got 'big'",  # the key inside a flow mapping
        "line 4: models.llama.cpp.memory_gb: must be at least 0, got -1",  # where the alias's value is
    }


def test_two_faults_of_one_sweep_are_named_in_one_refusal():
    """Issue 39: a NaN cool-down and an infinite memory floor were refused naming only the floor
    (the NaN passed a hand-made bound). Both are named, and so is a rule between fields beside a
    faulty field."""
    with pytest.raises(SweepError) as e:
        parse_sweep(yaml_of(cooldown_seconds=float("nan"), target={"min_memory_gb": float("inf")}))
    assert [p.split(": ", 1)[1] for p in e.value.problems] == [
        "target.min_memory_gb: must be finite, got inf",
        "cooldown_seconds: must be finite, got nan",
    ], e.value.problems
    with pytest.raises(SweepError) as e:
        parse_sweep(yaml_of(engines=["mlx", "cuda"], ngram={"n_min": 5, "n_max": 3}, warmup=21))
    named = " | ".join(e.value.problems)
    for fault in ("engines: unknown engine 'cuda'", "ngram: n_min (5) must not exceed n_max (3)", "warmup: must be at"):
        assert fault in named, named
