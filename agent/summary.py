"""Turn an engine's raw `Generation` into the figures a run reports. Pure functions."""

from __future__ import annotations

import hashlib
import statistics

from agent.engines.base import Detokenizes, Generation, supports
from specfleet.record import TEXT_SAMPLE_CHARS


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def output_sha256(tokens: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()


def text_sample(engine, tokens: list[int]) -> str | None:
    """The start of a run's decoded output, at most TEXT_SAMPLE_CHARS; None where the engine cannot
    decode (it has no `detokenize`: the server engines) or fails to."""
    if not supports(engine, Detokenizes):
        return None
    try:
        text = engine.detokenize(tokens)
    except Exception:  # noqa: BLE001  (a sample is an aid, never a reason to lose the run)
        return None
    return text.encode("utf-8", errors="replace").decode("utf-8")[:TEXT_SAMPLE_CHARS]


def arrival_gaps(times: list[float]) -> list[float]:
    """Gaps between token arrivals as a streaming client sees them: tokens emitted together (a
    speculative round's accepted tokens and the target's own) are one arrival, so no gap is an
    artefact of a burst's zero spacing."""
    arrivals = sorted(set(times))
    return [b - a for a, b in zip(arrivals, arrivals[1:])]


TIMINGS_AGREEMENT = 0.05  # client and server decode tok/s further apart than this flag a run


def _acceptance(accepted_at, drafted_at) -> tuple[float, ...]:
    return tuple(acc / dr if dr else 0.0 for acc, dr in zip(accepted_at, drafted_at))


def summarise(gen: Generation) -> dict:
    """The RunRecord fields one generation gives (specfleet/record.py), in base units. A server
    engine's run also carries the server's own accounting (`server_fields`)."""
    n = len(gen.tokens)
    gaps = arrival_gaps(gen.token_times_seconds)
    round_latency = [r.draft_seconds + r.verify_seconds for r in gen.rounds]
    fields = {
        "prompt_tokens": gen.prompt_tokens,
        "generated_tokens": n,
        "prefill_seconds": gen.prefill_seconds,
        "ttft_seconds": gen.token_times_seconds[0] if gen.token_times_seconds else gen.prefill_seconds,
        "decode_seconds": gen.decode_seconds,
        "wall_seconds": gen.prefill_seconds + gen.decode_seconds,
        # The first token comes from prefill; decode speed counts the tokens after it.
        "decode_tokens_per_second": (n - 1) / gen.decode_seconds if n > 1 and gen.decode_seconds > 0 else 0.0,
        "prefill_tokens_per_second": gen.prompt_tokens / gen.prefill_seconds if gen.prefill_seconds > 0 else 0.0,
        "peak_memory_bytes": gen.peak_memory_bytes,
        "output_sha256": output_sha256(gen.tokens),
        "inter_token_latency_p50_seconds": percentile(gaps, 50) if gaps else None,
        "inter_token_latency_p90_seconds": percentile(gaps, 90) if gaps else None,
        "inter_token_latency_p99_seconds": percentile(gaps, 99) if gaps else None,
        "round_latency_p50_seconds": percentile(round_latency, 50) if round_latency else None,
        "round_latency_p90_seconds": percentile(round_latency, 90) if round_latency else None,
        "rounds": len(gen.rounds),
        "tokens_drafted": sum(r.drafted for r in gen.rounds),
        "tokens_accepted": sum(r.accepted for r in gen.rounds),
        "draft_seconds": sum(r.draft_seconds for r in gen.rounds),
        "verify_seconds": sum(r.verify_seconds for r in gen.rounds),
        "drafted_by_position": tuple(gen.drafted_by_position),
        "acceptance_by_position": _acceptance(gen.accepted_by_position, gen.drafted_by_position),
    }
    if gen.server is not None:
        fields.update(server_fields(gen, fields["decode_tokens_per_second"]))
    return fields


def server_fields(gen: Generation, client_tokens_per_second: float) -> dict:
    """A server run's record fields (the system itself comes from the job: protocol.system_of):
    the server's version and command line, its own timings beside the client's
    (flagged when they disagree by more than TIMINGS_AGREEMENT), and its draft counts, which a
    client cannot see (it sees tokens arrive, not rounds)."""
    s = gen.server
    disagree = None
    if s.decode_tokens_per_second and client_tokens_per_second:
        gap = abs(client_tokens_per_second - s.decode_tokens_per_second) / s.decode_tokens_per_second
        disagree = gap > TIMINGS_AGREEMENT
    out = {
        "server_version": s.version,
        "server_command": s.command,
        "server_decode_tokens_per_second": s.decode_tokens_per_second,
        "server_prefill_seconds": s.prefill_seconds,
        "timings_disagree": disagree,
        "drafter_warm": s.drafter_warm,
        "interleaving": s.interleaving,
    }
    if s.drafted is not None:
        out["tokens_drafted"], out["tokens_accepted"] = s.drafted, s.accepted or 0
    if s.drafted_by_position:
        out["drafted_by_position"] = tuple(s.drafted_by_position)
        out["acceptance_by_position"] = _acceptance(s.accepted_by_position, s.drafted_by_position)
    return out


# A run whose model-drafted proposals are almost never accepted is flagged: for MTP that
# usually means a wrong norm convention, a trunk whose hidden states are shifted by one
# position, or a model converted without its MTP tensors (the head is then random); for a
# draft model, a draft that does not belong to the target.
COLLAPSED_ACCEPTANCE = 0.03
COLLAPSE_MIN_DRAFTED = 16  # fewer proposals say too little to flag
_COLLAPSE_CAUSES = {
    "mtp": "check the MTP head: norm convention (zero-centred weights need 1 + w), hidden state "
    "taken from the right position and after the final norm, MTP tensors present in the converted model",
    "draft": "check that the draft model belongs to the target (same family, tokenizer and chat format)",
}


# llama-server's model-drafted types, by the cause that explains a collapse.
_SERVER_DRAFTERS = {"draft-mtp": "mtp", "draft-simple": "draft", "draft-eagle3": "draft", "draft-dflash": "draft"}


def acceptance_flags(method: str, gen: Generation) -> dict:
    """RunRecord fields acceptance_collapsed (None for methods without a model drafter) and
    acceptance_reason. A server run is judged on the server's own counts."""
    cause = _COLLAPSE_CAUSES.get(_SERVER_DRAFTERS.get(method, method))
    if cause is None:
        return {"acceptance_collapsed": None, "acceptance_reason": ""}
    if gen.server is not None and gen.server.drafted is not None:
        drafted, accepted = gen.server.drafted, gen.server.accepted or 0
    else:
        drafted = sum(r.drafted for r in gen.rounds)
        accepted = sum(r.accepted for r in gen.rounds)
    if drafted < COLLAPSE_MIN_DRAFTED or accepted / drafted >= COLLAPSED_ACCEPTANCE:
        return {"acceptance_collapsed": False, "acceptance_reason": ""}
    return {
        "acceptance_collapsed": True,
        "acceptance_reason": f"{accepted} of {drafted} {method} proposals accepted "
        f"({accepted / drafted:.1%}, below {COLLAPSED_ACCEPTANCE:.0%}): {cause}",
    }


def relative_spread(values: list[float]) -> float:
    """(max - min) / median: how far apart repeated measurements are."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else float("inf")
