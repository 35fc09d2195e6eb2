"""`specfleet demo --real`'s sweeps (cli/demo.py real_sweeps): valid sweeps on the models
`scripts/setup.sh --real-models` installs, and a one-line refusal naming the set-up when they are not there."""

from __future__ import annotations

import pytest
import yaml

from cli import demo
from specfleet import sweeps


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
