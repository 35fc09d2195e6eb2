"""The ledger file's pydantic model (dashboard/claims/schema.py): every problem of a file named at
once, each by its field and its line; the real ledger loads; an unknown key is refused at every
level of a record."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from dashboard import claims
from dashboard.claims import schema
from dashboard.claims.claim import DECLARED_CONDITIONS, OWN_CONDITIONS
from tests.support.claims import GOOD

# Three records, the second sound; each fault on a line of its own (the line numbers are the text's).
MALFORMED = textwrap.dedent(
    """\
    - id: first
      statement: Drafting wins.
      source: {file: seeds/x.txt, section: S, quote: q}
      conditions:
        engine: mlx
        method: draft
        depth: 99
        sampler: {temperature: hot}
      metric: speedup
      expected: above 1
      verdict: {rule: above, threshold: 1.0, min_prompts: 2}
    - id: second
      statement: Drafting wins again.
      source: {file: seeds/x.txt, section: S, quote: q}
      conditions: {engine: mlx, method: draft, depth: 2}
      metric: speedup
      expected: above 1
      verdict: {rule: above, threshold: 1.0}
    - id: third
      statement: MTPLX wins.
      source: {file: seeds/x.txt, section: S, quote: q}
      colour: red
      conditions:
        engine: openai
        system: MTPLX
        method: mtp
        depth: 3
      metric: speed
      expected: 2x
      verdict: {rule: range, low: 3.0, high: 2.0}
      sweep: {max_new_tokens: 0}
    """
)


def test_a_malformed_ledger_names_every_problem_by_its_line():
    with pytest.raises(claims.ClaimError) as e:
        claims.parse_claims(MALFORMED)
    got = e.value.problems
    expected = {
        ("claims[0] (first).conditions.depth:", 7),
        ("claims[0] (first).conditions.sampler.temperature: must be a number", 8),
        ("claims[0] (first).verdict.min_prompts: must be an integer >= 5", 11),
        ("claims[2] (third).colour: unknown field", 22),
        ("claims[2] (third).metric: must be one of speedup,", 28),
        ("claims[2] (third).verdict.low: must lie in [0, verdict.high) (2.0)", 30),
        ("claims[2] (third).sweep.max_new_tokens: must be a token count 1-16384", 31),
    }
    for start, line in expected:
        assert any(p.startswith(start) and p.endswith(f"(line {line})") for p in got), (start, line, got)
    assert len(got) == len(expected), got
    assert not any("(second)" in p for p in got)
    assert all(p in str(e.value) for p in got)  # one error, listing them all


def test_rules_between_fields_are_all_named_under_their_own_fields():
    """A model validator that finds several rules broken names each, not only the first."""
    rec = {
        **GOOD,
        "conditions": {**GOOD["conditions"], "engine": "openai", "system": "oMLX", "method": "mtp"},
        "sweep": {"flags": "-ngl 99"},
    }
    with pytest.raises(claims.ClaimError) as e:
        claims.parse_claims(yaml.safe_dump([rec]))
    fields = [p.split(":", 1)[0] for p in e.value.problems]
    assert fields == [
        "claims[0] (my-claim).sweep.flags",
        "claims[0] (my-claim).sweep.command",
        "claims[0] (my-claim).sweep.arm_command",
    ], e.value.problems


def test_the_real_ledger_loads_and_every_record_is_its_model():
    ledger = claims.load_claims()
    records = yaml.safe_load(claims.LEDGER.read_text())
    assert [c.id for c in ledger] == [r["id"] for r in records] and len(ledger) >= 35
    for rec, claim in zip(records, ledger):
        model = schema.ClaimRecord.model_validate(rec)
        assert model.claim(rec) == claim
        assert claim.conditions["system"] == model.conditions.resolved_system


@pytest.mark.parametrize(
    "change, where, allowed",
    [
        ({"colour": "red"}, "claims[0] (my-claim).colour", "conditions, conflicts, expected"),
        ({"conditions": {**GOOD["conditions"], "gpu": "x"}}, "claims[0] (my-claim).conditions.gpu", "architecture"),
        (
            {"conditions": {**GOOD["conditions"], "sampler": {"temp": 0}}},
            "claims[0] (my-claim).conditions.sampler.temp",
            "temperature",
        ),
        ({"verdict": {**GOOD["verdict"], "hi": 2}}, "claims[0] (my-claim).verdict.hi", "high, low"),
        ({"sweep": {"path": "x"}}, "claims[0] (my-claim).sweep.path", "arm_command, command"),
        ({"source": {**GOOD["source"], "page": 3}}, "claims[0] (my-claim).source.page", "file, quote, section"),
    ],
)
def test_the_model_refuses_an_unknown_key_naming_the_allowed_ones(change, where, allowed):
    with pytest.raises(claims.ClaimError) as e:
        claims.parse_claims(yaml.safe_dump([{**GOOD, **change}]))
    (problem,) = e.value.problems
    assert problem.startswith(f"{where}: unknown field (allowed: ") and allowed in problem, problem


def test_the_model_names_every_condition_selection_reads():
    assert set(schema.Conditions.model_fields) == OWN_CONDITIONS | set(DECLARED_CONDITIONS)


def test_a_file_that_is_not_yaml_is_named_so():
    with pytest.raises(claims.ClaimError, match="file: not valid YAML"):
        claims.parse_claims("- id: [unclosed\n")
