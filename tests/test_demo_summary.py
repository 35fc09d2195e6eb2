"""The demo's summary (cli/demo.py summary_table) on a busy machine, without running the demo:
runs judged not nominal leave an arm's speedup to the one definition over every run, marked as
such, instead of `nan`; a nominal pair, where there is one, still decides the figure alone.
tests/test_demo.py checks the printed figures against the stored runs of a real demo."""

import pandas as pd
import pyarrow as pa
import pytest

from cli.demo import NOT_NOMINAL, summary_table
from tests.support.fleet import jobs_of, run_record


def stored(nominal: list[bool | None], draft_tps: float = 50.0) -> pd.DataFrame:
    """One cell as the coordinator stores it: per prompt a baseline at 100 tok/s and a draft arm,
    both judged `nominal[prompt]`."""
    rows = []
    for p, judged in enumerate(nominal):
        for method, depth, tps in (("baseline", 0, 100.0), ("draft", 2, draft_tps + p)):
            record = run_record("job-1", method, depth, tps, prompt_id=f"code-{p + 1:02d}", env_nominal=judged)
            stored = {"lease_id": "lease-1", "agent_id": "a", "machine_id": "a", "chip": "c", "sweep_id": "s"}
            rows.append({**record.row(), **stored})
    return pd.DataFrame(rows)


def draft_row(runs: pd.DataFrame) -> tuple[list[str], str]:
    text = summary_table(pa.Table.from_pandas(runs), pa.Table.from_pandas(jobs_of(runs)))
    assert "nan" not in text, text
    return next(line.split() for line in text.splitlines() if line.startswith("mlx ") and " draft " in line), text


@pytest.mark.parametrize("judged", [True, None])
def test_nominal_or_unknown_runs_print_the_plain_speedup(judged):
    row, text = draft_row(stored([judged] * 3))
    assert row[5] == "0.51" and NOT_NOMINAL not in text, text  # median of 50, 51, 52 over 100


def test_a_machine_busy_throughout_prints_the_same_figure_marked():
    row, text = draft_row(stored([False] * 3))
    assert row[5] == f"0.51{NOT_NOMINAL}", text
    assert f"{NOT_NOMINAL} from runs judged not nominal" in text


def test_a_nominal_pair_decides_alone_and_is_not_marked():
    row, text = draft_row(stored([False, True, False], draft_tps=10.0))
    assert row[5] == "0.11", text  # prompt 2 alone: 11 / 100
    assert NOT_NOMINAL not in text, text


def repeats(draft_tps: list[float], **draft_fields) -> pd.DataFrame:
    """One prompt, a repeat per draft speed: the baseline at 80 tok/s each time."""
    rows = []
    for r, tps in enumerate(draft_tps):
        for method, depth, speed, fields in (("baseline", 0, 80.0, {}), ("draft", 2, tps, draft_fields)):
            record = run_record("job-1", method, depth, speed, repeat=r, env_nominal=True, **fields)
            stored = {"lease_id": "lease-1", "agent_id": "a", "machine_id": "a", "chip": "c", "sweep_id": "s"}
            rows.append({**record.row(), **stored})
    return pd.DataFrame(rows)


def test_a_stalled_run_stays_in_the_row_and_its_speedup_and_is_counted():
    """Issue 26's run (11.7 tok/s among repeats of about 93): kept (issue 37); the row's median
    decode speed and its speedup (the median over the prompt's repeats) barely move, and the row
    counts the stall."""
    row, text = draft_row(repeats([63 / 0.68, 63 / 0.70, 63 / 5.4, 63 / 0.66]))
    assert row[-2:] == ["4", "1"], text  # runs, stalls
    assert row[3] == f"{(63 / 0.68 + 63 / 0.70) / 2:.1f}", text  # the median of the four
    assert row[5] == f"{63 / (0.68 * 0.70) ** 0.5 / 80:.2f}" == "1.14", text  # a mean with the stall: 0.69
    assert "stalls: runs under 1/2 of the median speed" in text


def test_a_near_tie_is_labelled_and_kept():
    near_tie = {"lossless": None, "divergence": "near-tie", "divergence_position": 51, "divergence_margin": 0.07}
    row, text = draft_row(repeats([100.0, 100.0], **near_tie))
    assert row[5] == "1.25" and row[7] == "near-tie", text
    assert "near-tie: a run's output left the baseline's" in text
    assert "near-tie: mlx draft 2 on code-01 left its reference at token 51 in 2 run(s): margin 0.07" in text, text


def test_a_defect_says_where_and_why_margin_or_not():
    """Each lossless NO is explained per prompt: the token where the runs left their reference,
    and the margin against its threshold, or the reason none was measured."""
    measured = {"lossless": False, "divergence": "defect", "divergence_position": 39, "divergence_token": 393}
    measured.update(divergence_reference_token=75, divergence_margin=0.9, divergence_threshold=0.25)
    measured.update(divergence_cause="")
    jobs = pa.Table.from_pandas(jobs_of(repeats([100.0])))
    text = summary_table(pa.Table.from_pandas(repeats([100.0, 100.0], **measured)), jobs)
    assert next(line for line in text.splitlines() if line.startswith("mlx ") and " draft " in line).split()[7] == "NO"
    said = "lossless NO: mlx draft 2 on code-01 left its reference at token 39 (393 for 75) in 2 run(s): margin"
    assert f"{said} 0.9 against a near-tie threshold of 0.25" in text, text
    cause = "llama-server: token(s) [393] not among the top 20 at position 91: no margin"
    unmeasured = {**measured, "divergence_margin": None, "divergence_threshold": None, "divergence_cause": cause}
    text = summary_table(pa.Table.from_pandas(repeats([100.0, 100.0], **unmeasured)), jobs)
    assert f"in 2 run(s): no margin: {cause}" in text, text


def test_the_greedy_baselines_of_two_systems_are_compared_token_for_token():
    runs = repeats([100.0, 100.0])
    server = runs[runs.method == "baseline"].assign(system="llama-server", threads=1)
    server.loc[server.index[0], "output_sha256"] = "cd" * 32  # one run gave other tokens
    text = summary_table(
        pa.Table.from_pandas(pd.concat([runs.assign(threads=1), server])), pa.Table.from_pandas(jobs_of(runs))
    )
    assert "greedy baselines, llama-server and mlx at 1 thread(s): the same tokens on 0 of 1 prompt(s)" in text, text


def test_a_servers_held_back_ids_leave_its_text_to_compare():
    """llama-server's stream drops the id of a token whose text is incomplete UTF-8, so its token
    hash differs from ours: where both texts are one, the summary says so beside the token count;
    where the texts differ too, it does not."""
    runs = repeats([100.0, 100.0]).assign(threads=1)
    runs.loc[runs.method == "baseline", "text_sample"] = "one, two, three"
    server = runs[runs.method == "baseline"].assign(system="llama-server", output_sha256="cd" * 32)
    jobs = pa.Table.from_pandas(jobs_of(runs))
    text = summary_table(pa.Table.from_pandas(pd.concat([runs, server])), jobs)
    assert (
        "greedy baselines, llama-server and mlx at 1 thread(s): the same tokens on 0 of 1 prompt(s),"
        " the same text on 1 more (ids a server's stream held back)"
    ) in text, text
    # A stream never sends an output's incomplete UTF-8 tail, which a detokenized text renders as
    # U+FFFD (the CUDA run's qa-01): the same text.
    cut = runs.assign(text_sample=runs.text_sample.where(runs.method != "baseline", "one, two, three\ufffd"))
    text = summary_table(pa.Table.from_pandas(pd.concat([cut, server])), jobs)
    assert "the same tokens on 0 of 1 prompt(s), the same text on 1 more" in text, text
    other = server.assign(text_sample="one, two, four")
    text = summary_table(pa.Table.from_pandas(pd.concat([runs, other])), jobs)
    assert text.endswith("the same tokens on 0 of 1 prompt(s)") and "same text" not in text, text
