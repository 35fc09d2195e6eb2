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
            assert cell.settings.prompt_format == "auto"  # chat: both models have a template
    assert engines == {"llama.cpp", "llama-server", "mlx"}
    llama = next(s for s in specs if s["name"] == "real-smollm2")
    assert llama["models"]["llama.cpp"]["draft"].endswith(demo.SMOLLM2_DRAFT)
    assert {"ngram", "ngram-mod", "draft"} <= set(llama["methods"])


def test_missing_models_name_the_set_up(tmp_path):
    with pytest.raises(FileNotFoundError, match="scripts/setup.sh --real-models"):
        demo.real_sweeps(tmp_path)
