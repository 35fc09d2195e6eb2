"""Claims for the tests: a well-formed record (GOOD), a ledger claim by id, and a ledger claim
moved onto our own loop of the same method (ours)."""

from __future__ import annotations

from dashboard import claims
from specfleet.record import IN_PROCESS_ENGINES

GOOD = {
    "id": "my-claim",
    "statement": "Drafting wins on an M4 Pro.",
    "source": {"file": "seeds/x.txt", "section": "Somewhere", "quote": "wins"},
    "conditions": {
        "engine": "mlx",
        "method": "draft",
        "chip": "Apple M4 Pro",
        "depth": 2,
        "sampler": {"temperature": 0},
    },
    "metric": "speedup",
    "expected": "above 1",
    "verdict": {"rule": "above", "threshold": 1.0, "min_machines": 3, "min_runs": 3},
}


def claim(claim_id):
    return next(c for c in claims.load_claims() if c.id == claim_id)


def ours(claim_id):
    """A ledger claim about llama-server or MTPLX on our loop of the same method and weights
    (claims.our_loop, what stands beside its verdict), with its other conditions and band: the
    rules tested on the fleet's own system."""
    c = claims.our_loop(claim(claim_id))
    assert c is not None and c.system == claims.OURS and c.engine in IN_PROCESS_ENGINES
    return c
