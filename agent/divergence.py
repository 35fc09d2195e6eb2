"""Where a run's output first leaves its lossless check's reference, and whether that is a defect.

Under greedy sampling a speculative method must emit the baseline's tokens. It may not, without
any defect, where the target's top two tokens are nearly tied: the baseline decodes one token at
a time, a speculative round verifies K+1 rows in one batch, and the two computations round
differently (issue 26: Gemma 3 270M's summarisation-01 diverges at token 51, where one-token
decoding ranks two tokens 0.15 apart and the 4-row verify batch reverses them; llama-server's own
draft-simple and ngram-mod flip the same way).

So each checked run records its first divergence: the generated-token index, the run's token
and the reference's, and the target's logit margin between the two there (`Engine.logit_margin`
with `pair`, one-token decoding on the reference's prefix). The divergence is a **near-tie** when
that margin is under the threshold: the larger of NEAR_TIE_LOGITS and NOISE_FACTOR times the most
that batching changes it by at that very position (the same prefix with its last r tokens as one
forward pass, for every r from 2 to the arm's verify batch of depth + 1: the engine's own
batch-vs-single test, run where it matters). A near-tie run keeps `lossless` None and stays in the
figures labelled "diverged at a near-tie"; any other divergence is a defect (`lossless` false), as
is one whose margin cannot be read (the openai engine has no logit_margin; llama-server's is its n_probs),
which records why (`divergence_cause`).

NEAR_TIE_LOGITS comes from that test on the tiny models (tests/test_divergence.py, which fails if
it no longer holds): the largest single-row-vs-batch logit difference is 1.7e-3 on the float32
GGUF with llama.cpp on CPU (8-row batches, three prompts), 0 with MLX on CPU and 0 on Q8_0 and
Q4_0 quantisations of the same GGUF. 0.02 is about ten times the largest. Real quantised models
move far more, which is why the threshold is measured again at each divergence: on Gemma 3 270M
Q4_K_M (llama.cpp, CPU, one thread; summarisation-01 to -14, 64 tokens, draft K=3 and K=5 with a
Q2_K draft, prompt lookup K=3) batching moved the gap by 0.06-0.31 logits at the divergences
(thresholds 0.14-0.63); 25 divergences fell under their threshold (gaps 0.009-0.25; position 51
of summarisation-01 among them, gap 0.070 against 0.244) and two stayed defects just above it
(summarisation-11's draft arms: gap 0.238 against 0.213).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agent.engines.base import UNKNOWN_ID, EngineError, LogitMargins, supports

log = logging.getLogger(__name__)

NEAR_TIE_LOGITS = 0.02  # logits: ~10x the largest single-vs-batch difference measured on the tiny models
NOISE_FACTOR = 2.0  # a margin under twice what the batch changes it by at that position is a near-tie
NEAR_TIE_LABEL = "diverged at a near-tie"


def first_divergence(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """The first generated-token index where the two differ (the shorter's length if one is a
    prefix of the other); None when they are equal. A position whose id either side does not know
    (UNKNOWN_ID: llama-server's held-back ids, an OpenAI stream's text) is not compared: the
    known ids around it decide, as the greedy baselines on CUDA showed (bench/README.md)."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b and UNKNOWN_ID not in (a, b):
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


class Divergences:
    """Judges a job's runs against their references; margins are computed once per prompt,
    position, token pair and batch size (repeats diverge alike)."""

    def __init__(self, engine, floor: float = NEAR_TIE_LOGITS):
        self.engine, self.floor = engine, floor
        self._margins: dict[tuple, tuple[float | None, float | None, bool]] = {}

    def judge(self, prompt: Sequence[int], tokens: Sequence[int], reference, check: str, rows: int) -> dict:
        """The record's divergence fields and `lossless` for one run checked by `check` ("greedy
        reference", "same-seed baseline", or not checkable with reference None); `rows`: the
        arm's verify batch (depth + 1; 1 for a baseline)."""
        if reference is None or check not in ("greedy reference", "same-seed baseline"):
            return {}
        at = first_divergence(tokens, reference)
        if at is None:
            return {"lossless": True, "divergence": "none"}
        out = {"lossless": False, "divergence": "defect", "divergence_position": at}
        if at >= min(len(tokens), len(reference)):
            return out  # one output is longer: no token pair to judge
        ours, theirs = tokens[at], reference[at]
        out.update(divergence_token=ours, divergence_reference_token=theirs)
        if check != "greedy reference":
            return out  # a sampled draw has no margin to judge
        margin, threshold, tied, cause = self._margin(tuple(prompt) + tuple(reference[:at]), ours, theirs, rows)
        out["divergence_cause"] = cause
        if margin is not None:
            out.update(divergence_margin=margin, divergence_threshold=threshold)
        if tied:
            out.update(lossless=None, divergence="near-tie")
        return out

    def _margin(self, prefix: tuple, ours: int, theirs: int, rows: int) -> tuple[float | None, float | None, bool, str]:
        key = (prefix, ours, theirs, rows)
        if key not in self._margins:
            self._margins[key] = self._measure(prefix, ours, theirs, rows)
        return self._margins[key]

    def _measure(self, prefix: tuple, ours: int, theirs: int, rows: int):
        """(margin, threshold, near-tie, cause): the cause is "" when the margin was measured,
        else why not (the record's divergence_cause)."""
        if not supports(self.engine, LogitMargins):
            return None, None, False, f"{getattr(self.engine, 'name', 'the engine')} reads no logits: no margin"
        margin_of = self.engine.logit_margin
        position, pair = len(prefix), (theirs, ours)
        try:
            # logit[theirs] - logit[ours] in one-token decoding, then with the same position the
            # last row of every batch size up to the arm's verify batch: each size splits the
            # prefix's cache and the rows differently.
            single = margin_of(prefix, position, 1, pair)
            batches = [margin_of(prefix, position, r, pair) for r in range(2, max(1, min(rows, position)) + 1)]
        except EngineError as e:
            log.warning("no logit margin at a divergence: %s", e)
            return None, None, False, str(e)
        noise = max((abs(single.margin - b.margin) for b in batches), default=0.0)
        threshold = max(self.floor, NOISE_FACTOR * noise)
        return abs(single.margin), threshold, abs(single.margin) < threshold, ""
