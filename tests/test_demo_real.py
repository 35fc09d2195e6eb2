"""`specfleet demo --real`'s sweeps (cli/demo.py real_sweeps): valid sweeps on the models
`scripts/setup.sh --real-models` installs, a one-line refusal naming the set-up when they are not there,
and the dashboard on the data of the real demo's first sweep."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli import demo
from specfleet import sweeps
from tests.support.browser import START_SECONDS, chromium_page, every_page, wait_http
from tests.support.ports import free_port
from tests.support.processes import ROOT, needs_llama_server, spawn, start_coordinator, stop


def test_real_sweeps_are_valid_and_cover_both_engines_and_llama_server(tmp_path):
    for name in (demo.SMOLLM2, demo.SMOLLM2_DRAFT, demo.GEMMA3, demo.GEMMA3_DRAFT):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / demo.SMOLLM2_MLX).mkdir()
    specs = demo.real_sweeps(tmp_path)
    engines = set()
    for spec in specs:
        parsed = sweeps.parse_sweep(yaml.safe_dump(spec))
        for cell in parsed.cells():
            engines.add(cell.engine)
            if spec["name"] != "real-gemma3":  # its near-tie is on raw text
                assert cell.settings.prompt_format == "auto"  # chat: both models have a template
    assert engines == {"llama.cpp", "llama-server", "mlx"}
    by_name = {s["name"]: s for s in specs}
    lookup, draft, mod = (by_name[f"real-smollm2{n}"] for n in ("", "-draft", "-ngram-mod"))
    assert lookup["prompt_sets"] == ["qa", "rag", "code"] and set(lookup["methods"]) == {"ngram"}
    assert draft["models"]["llama.cpp"]["draft"].endswith(demo.SMOLLM2_DRAFT) and set(draft["methods"]) == {"draft"}
    assert set(mod["methods"]) == {"ngram-mod"}
    assert [a["spec_type"] for s in (lookup, draft, mod) for a in s["arms"]] == [
        "ngram-simple",
        "draft-simple",
        "ngram-mod",
    ]
    # One llama.cpp thread in our loop and in llama-server alike: their greedy tokens are comparable.
    assert all(s["threads"] == 1 for s in specs if "mlx" not in s["engines"])
    gemma = by_name["real-gemma3"]
    assert gemma["prompt_format"] == "raw" and gemma["prompt_sets"] == ["summarisation"]
    assert gemma["max_new_tokens"] > 51  # the near-tie is at token 51


def test_missing_models_name_the_set_up(tmp_path):
    with pytest.raises(FileNotFoundError, match="scripts/setup.sh --real-models"):
        demo.real_sweeps(tmp_path)


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.engine
@needs_llama_server
@pytest.mark.timeout(900)
def test_every_page_renders_after_the_real_demos_first_sweep(tmp_path):
    """`specfleet demo --real`'s first sweep (SmolLM2 through its chat template, our loop and
    llama-server), then the dashboard on its data: every page, comparable group and tab renders
    without an exception element."""
    models = Path(os.environ.get("SPECFLEET_MODELS_DIR", ROOT / ".data" / "models"))
    try:
        first = demo.real_sweeps(models)[0]["name"]
    except FileNotFoundError as e:  # `make test` installs them (scripts/setup.sh --real-models)
        pytest.skip(str(e))
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "demo", "--real", "--sweep", first, "--no-dashboard", "--data-dir",
         str(tmp_path / "demo"), "--models-dir", str(models)],
        cwd=ROOT, capture_output=True, text=True, timeout=800,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data_dir = tmp_path / "demo" / "coordinator"
    coordinator = start_coordinator(data_dir)[0]
    port = free_port()
    dashboard = spawn("dashboard", "--data-dir", str(data_dir), "--port", str(port), log=tmp_path / "dashboard.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", dashboard, tmp_path / "dashboard.log", START_SECONDS)
        with chromium_page() as page:
            seen = every_page(page, f"http://127.0.0.1:{port}")
    finally:
        stop(dashboard)
        stop(coordinator)
    groups = [k for k in seen if k.startswith("compare: ")]
    assert groups and all("SmolLM2" in k or "smollm2" in k.lower() for k in groups), groups
    assert "Open questions" in seen["questions"]
