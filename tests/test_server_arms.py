"""Server arms in sweep files: llama-server configurations (spec types, depths, the types' own
parameters, whole command lines from the seeds) and OpenAI-compatible servers' templates."""

import pytest
import yaml

from specfleet.record import Arm, ServerSpec
from specfleet.sweeps import SweepError, parse_sweep

MODEL = "Qwen3.5-9B-MTP-Q4_K_M.gguf"
# The bug report's two command lines (seeds/001), the baseline with the MTP GGUF: one model.
SEED_BASELINE = f"llama-server -m {MODEL} -ngl 99 --port 8080"
SEED_MTP = f"llama-server -m {MODEL} -ngl 99 --port 8080 --spec-type draft-mtp --spec-draft-n-max 6"


def sweep(engine="llama-server", **fields):
    doc = {
        "name": "s",
        "engines": [engine],
        "prompt_sets": ["code"],
        "models": {engine: {"target": MODEL}},
        **fields,
    }
    return yaml.safe_dump(doc)


def arms_of(text, engine="llama-server"):
    return parse_sweep(text).cells()[0].arms


def test_spec_types_depths_and_params_become_arms():
    text = sweep(
        server={"flags": "-ngl 99 -fa on -c 65536 --parallel 1"},
        arms=[
            {"spec_type": "draft-mtp", "depths": [1, 2, 3]},
            {"spec_type": "ngram-mod", "params": {"n_match": 24, "n_min": 48}},
            {"spec_type": "draft-mtp,ngram-mod", "depths": [3]},
        ],
    )
    cell = parse_sweep(text).cells()[0]
    assert cell.server == ServerSpec(flags=("-ngl", "99", "-fa", "on", "-c", "65536", "--parallel", "1"))
    assert cell.arms == (
        Arm("baseline"),
        Arm("draft-mtp", 1),
        Arm("draft-mtp", 2),
        Arm("draft-mtp", 3),
        Arm("ngram-mod", 64, ("--spec-ngram-mod-n-match", "24", "--spec-ngram-mod-n-min", "48")),  # llama.cpp's n_max
        Arm("draft-mtp,ngram-mod", 3),
    )
    assert cell.verify_cost is None


def test_in_process_methods_beside_server_arms_ask_nothing_of_the_server_engine():
    doc = yaml.safe_load(sweep(arms=[{"spec_type": "draft-mtp"}], methods={"draft": [2]}))
    doc["engines"].append("llama.cpp")
    doc["models"]["llama.cpp"] = {"target": MODEL, "draft": "d.gguf"}
    cells = {c.engine: c for c in parse_sweep(yaml.safe_dump(doc)).cells()}
    assert cells["llama.cpp"].arms == (Arm("baseline"), Arm("draft", 2))
    assert cells["llama-server"].arms == (Arm("baseline"), Arm("draft-mtp", 3))


def test_the_seeds_command_lines_are_arms():
    arms = arms_of(sweep(arms=[{"command": SEED_BASELINE}, {"command": SEED_MTP}]))
    # The port is the agent's; the baseline's own line replaces nothing: both keep their -ngl.
    assert arms == (Arm("baseline"), Arm("baseline", 0, ("-ngl", "99")), Arm("draft-mtp", 6, ("-ngl", "99")))


def test_a_command_line_for_another_model_is_refused():
    other = "llama-server -m Qwen3.5-9B-Q4_K_M.gguf -ngl 99 --port 8080"
    with pytest.raises(SweepError, match=r"arms\[0\]\.command: -m Qwen3.5-9B-Q4_K_M.gguf is not the sweep's target"):
        parse_sweep(sweep(arms=[{"command": other}]))


def test_arms_whose_free_flags_differ_are_noted():
    notes = parse_sweep(sweep(arms=[{"spec_type": "draft-mtp", "flags": "-c 4096"}])).notes()
    assert any("arms differ in flags besides speculation" in n for n in notes)
    notes = parse_sweep(sweep(arms=[{"spec_type": "ngram-mod", "params": {"n_min": 8}}])).notes()
    assert not any("arms differ" in n for n in notes)


def test_openai_templates():
    text = sweep(
        "openai",
        server={"system": "MTPLX", "command": "mtplx serve --model {model} --port {port}"},
        arms=[
            {
                "method": "mtp",
                "depths": [1, 3],
                "command": "mtplx serve --model {model} --mtp --depth {depth} --port {port}",
            }
        ],
    )
    cell = parse_sweep(text).cells()[0]
    assert cell.server.system == "MTPLX"
    assert [(a.method, a.depth) for a in cell.arms] == [("baseline", 0), ("mtp", 1), ("mtp", 3)]
    assert cell.arms[1].command.endswith("--depth {depth} --port {port}")


def test_a_running_openai_server_is_one_arm():
    text = sweep(
        "openai", server={"system": "oMLX", "url": "http://127.0.0.1:8000"}, arms=[{"method": "mtp", "depths": [3]}]
    )
    sweep_ = parse_sweep(text)
    assert sweep_.cells()[0].arms == (Arm("mtp", 3),)
    assert any("no speedup without a baseline" in n for n in sweep_.notes())


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"arms": [{"spec_type": "medusa"}]}, r"arms\[0\]\.spec_type: must be one of draft-simple"),
        ({"arms": [{"spec_type": "ngram-mod,ngram-mod"}]}, r"arms\[0\]\.spec_type: must be one of"),
        ({"arms": [{"spec_type": "ngram-mod", "depths": [65]}]}, r"arms\[0\]\.depths\[0\]: must be at most 64, got 65"),
        ({"arms": [{"spec_type": "ngram-mod", "params": {"size_n": 3}}]}, r"arms\[0\]\.params\.size_n: unknown field"),
        ({"arms": [{"spec_type": "draft-simple"}]}, r"draft-simple needs models.llama-server.draft"),
        ({"arms": [{"spec_type": "draft-mtp", "flags": "--port 9000"}]}, r"must not hold --port"),
        ({"server": {"flags": "-m other.gguf"}}, r"server\.flags: must not hold -m"),
        ({"arms": [{"command": "vllm serve x"}]}, r"must begin with llama-server"),
        ({"arms": [{"command": f"llama-server -m {MODEL} --spec-type eagle"}]}, r"--spec-type 'eagle' is not one of"),
        ({"arms": [{"command": f"llama-server -m {MODEL} --spec-draft-n-max 99"}]}, r"must be a depth from 0 to 64"),
        ({"arms": [{"command": "llama-server -m 'unclosed"}]}, r"is not a valid command line"),
        ({"arms": [{"command": SEED_MTP, "depths": [2]}]}, r"a command line stands alone"),
        ({"methods": {"mtp": [2]}}, r"methods\.mtp: applies to the in-process engines"),
    ],
)
def test_bad_llama_server_arms_are_refused_by_name(fields, message):
    with pytest.raises(SweepError, match=message):
        parse_sweep(sweep(**fields))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({}, r"server: is required for engine openai"),
        ({"server": {"command": "x --port {port}"}}, r"server\.system: is required"),
        (
            {"server": {"system": "MTPLX", "command": "mtplx serve --model {model}"}},
            r"server\.command: .*has no \{port\}",
        ),
        ({"server": {"system": "MTPLX", "command": "mtplx {colour} {port}"}}, r"unknown placeholder"),
        ({"server": {"system": "MTPLX", "url": "http://10.0.0.5:8000"}}, r"must be a loopback http URL"),
        ({"server": {"system": "MTPLX", "url": "https://127.0.0.1:8000"}}, r"must be a loopback http URL"),
        ({"server": {"system": "MTPLX", "url": "http://127.0.0.1:8000", "command": "x {port}"}}, r"exactly one of"),
        (
            {
                "server": {"system": "MTPLX", "command": "m {port}"},
                "arms": [{"method": "mtp", "depths": [1, 2], "command": "m {port}"}],
            },
            r"arms\[0\]\.command: .*has no \{depth\}",
        ),
        ({"server": {"system": "MTPLX", "command": "m {port}"}, "arms": [{"method": "medusa"}]}, r"arms\[0\]\.method"),
    ],
)
def test_bad_openai_servers_are_refused_by_name(fields, message):
    with pytest.raises(SweepError, match=message):
        parse_sweep(sweep("openai", **fields))


def test_arms_pinned_to_builds_are_cells_of_their_own_each_with_its_baseline():
    text = sweep(
        arms=[
            {"spec_type": "draft-mtp", "depths": [2], "server_build": "b9330"},
            {"spec_type": "draft-mtp", "depths": [2], "server_build": 9500},  # a bare build number is its tag
            {"spec_type": "ngram-mod", "depths": [64]},
            {"command": f"{SEED_BASELINE} -c 4096", "server_build": "b9500"},
        ]
    )
    cells = parse_sweep(text).cells()
    assert [c.server.build for c in cells] == ["b9330", "b9500", ""]
    assert [[(a.method, a.depth, a.flags) for a in c.arms] for c in cells] == [
        [("baseline", 0, ()), ("draft-mtp", 2, ())],
        [("baseline", 0, ()), ("draft-mtp", 2, ()), ("baseline", 0, ("-ngl", "99", "-c", "4096"))],
        [("baseline", 0, ()), ("ngram-mod", 64, ())],
    ]
    assert all(a.build == "" for c in cells for a in c.arms)  # the cell's ServerSpec carries it
    unpinned = parse_sweep(sweep(arms=[{"spec_type": "draft-mtp", "depths": [2]}])).cells()
    assert len(unpinned) == 1 and unpinned[0].server.build == ""


@pytest.mark.parametrize(
    "arm, message",
    [
        (
            {"spec_type": "draft-mtp", "server_build": "latest"},
            r"arms\[0\]\.server_build: must be a llama.cpp build tag",
        ),
        ({"spec_type": "draft-mtp", "server_build": True}, r"arms\[0\]\.server_build: must be a llama.cpp build tag"),
        ({"command": SEED_MTP, "server_build": "b1", "depths": [2]}, r"a command line stands alone"),
    ],
)
def test_a_bad_pinned_build_is_refused_by_name(arm, message):
    with pytest.raises(SweepError, match=message):
        parse_sweep(sweep(arms=[arm]))
    with pytest.raises(SweepError, match=r"arms\[0\]\.server_build: unknown field"):
        parse_sweep(sweep("openai", server={"system": "M", "command": "m {port}"}, arms=[
            {"method": "mtp", "command": "m {port}", "server_build": "b1"}
        ]))  # fmt: skip


def test_an_agents_builds_are_read_from_its_fingerprints_engine_versions():
    from specfleet.server_arms import build_tag, fingerprint_builds

    versions = {"llama-cpp-python": "0.3.36", "llama-server@b9330": "b9330-328874d", "llama-server@b1": "0.5 b1-0c1"}
    assert fingerprint_builds(versions) == {"b9330": "b9330-328874d", "b1": "0.5 b1-0c1"}
    assert [build_tag(v) for v in ("b9500", 9500, " b0009500 ", "9500", "b95x", "", None)] == [
        "b9500", "b9500", "b9500", "b9500", None, None, None,
    ]  # fmt: skip


def test_the_williams_note_counts_a_pinned_cells_arms():
    pinned = [{"spec_type": "draft-mtp", "depths": [2], "server_build": b} for b in ("b9330", "b9500")]
    notes = parse_sweep(sweep(arms=pinned, repeats=3)).notes()
    assert any("rounded up from 3 to 4 to complete the Williams design of 2 arms" in n for n in notes), notes
