"""Sweep files for the tests: a good one, one with changes, and a YAML alias bomb."""

from __future__ import annotations

import yaml

GOOD = {
    "name": "s",
    "engines": ["mlx"],
    "prompt_sets": ["code"],
    "models": {"mlx": {"target": "/m/t", "draft": "/m/d"}},
}


def yaml_of(**changes):
    """GOOD with `changes` as YAML; a change to None leaves the key out."""
    doc = {**GOOD, **changes}
    return yaml.safe_dump({k: v for k, v in doc.items() if v is not None})


def alias_bomb(levels: int = 9) -> str:
    """A few hundred bytes that expand to 9**levels values: every level lists the one above nine times."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nrepeats: *l{levels - 1}\n"
