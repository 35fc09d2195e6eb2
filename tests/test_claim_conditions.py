"""The claim conditions and metric this round declared, on fleets with known answers: a machine's
memory (memory_gb) selects runs but is never a checked key, thinking on and off (reasoning) are
settled apart, and an absolute tok/s claim (tokens_per_second) is the geometric mean of machine
means with the speedups' interval."""

import math
import re

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats as sps

from dashboard import claims
from specfleet import settings as declared
from specfleet.record import ModelIdentity, Sampler
from specfleet.schemas import setting_problem
from specfleet.settings import Settings
from specfleet.sweeps import parse_sweep
from tests.support.claims import GOOD
from tests.support.dashboard import record, row, sha
from tests.support.fleet import fleet_db

MODEL = ModelIdentity(reference="Qwen3.5-9B-MTP-Q4_K_M.gguf", digest=sha("9b"), quantisation="Q4_K_M")
SERVER = dict(engine="llama-server", system="llama-server", target=MODEL, sampler=Sampler(temperature=0.0))


def machine(agent: str, chip: str, base: float, arm: list[float], depth: int = 3, **fields) -> list[dict]:
    """One machine's job: per prompt a baseline at `base` tok/s and a draft-mtp run at arm[i] tok/s."""
    rows = []
    for i, tps in enumerate(arm):
        common = dict(SERVER, prompt_id=f"p{i}", **fields)
        rows.append(row(record(f"j-{agent}", "baseline", 0, base, **common), agent, chip))
        rows.append(row(record(f"j-{agent}", "draft-mtp", depth, tps, **common), agent, chip))
    return rows


def parse(**fields) -> claims.Claim:
    return claims.parse_claims(yaml.safe_dump([{**GOOD, **fields}]))[0]


def test_memory_is_a_condition_and_never_a_checked_key():
    s = declared.BY_NAME["memory_gb"]
    assert s.condition and not s.checked and s.source == declared.MEASURED and not s.sweep
    assert "memory_gb" in claims.DECLARED_CONDITIONS
    c = parse(
        conditions={"engine": "llama-server", "method": "draft-mtp", "chip": "Apple M4", "depth": 3, "memory_gb": 16},
        verdict={"rule": "below", "threshold": 1.0},
    )
    arm = [18.0, 18.5, 19.0, 18.2, 18.8]
    rows = machine("mini-16a", "Apple M4", 20.0, arm, settings=Settings(memory_gb=16))
    rows += machine("mini-16b", "Apple M4", 20.0, [x * 1.01 for x in arm], settings=Settings(memory_gb=16))
    rows += machine("mini-16c", "Apple M4", 20.0, [x * 0.99 for x in arm], settings=Settings(memory_gb=16))
    rows += machine("mini-24", "Apple M4", 20.0, [30.0] * 5, settings=Settings(memory_gb=24))  # a decoy
    runs = pd.DataFrame(rows)
    sel = claims.selection(c, fleet_db(runs))
    assert sel["selected"] == 30 and sel["excluded"] == {"memory_gb": 10}
    (out,) = claims.evaluate(c, fleet_db(runs)).itertuples()
    assert out.machines == 3 and out.figure < 1 and out.verdict == "reproduced"
    # 16 GB machines' runs are one comparable group with a 24 GB machine's: memory never splits a figure
    every = parse(conditions={"engine": "llama-server", "method": "draft-mtp", "chip": "Apple M4", "depth": 3})
    assert claims.evaluate(every, fleet_db(runs))["machines"].tolist() == [4]
    # a sweep cannot set a machine's memory: the claim's sweep targets machines with at least that much
    sweep = parse_sweep(claims.sweep_yaml(c))
    assert sweep.target["min_memory_gb"] == 16 and sweep.target["chips"] == ["Apple M4"]


def test_thinking_on_and_off_are_settled_apart():
    c = parse(
        conditions={"engine": "llama-server", "method": "draft-mtp", "chip": "Apple M1 Max", "depth": 2,
                    "reasoning": ["on", "off"]},
        verdict={"rule": "range", "low": 0.8, "high": 0.9},
    )  # fmt: skip
    on, off = [21.9, 22.0, 21.8, 21.9, 22.1], [17.0, 17.2, 16.9, 17.1, 17.0]
    rows = []
    levels_ = {"mbp-1": 1.0, "mbp-2": 1.002, "mbp-3": 0.997}  # machines differ a little
    for agent, level in levels_.items():
        on_, off_ = [x * level for x in on], [x * level for x in off]
        rows += machine(agent + "-on", "Apple M1 Max", 25.3, on_, depth=2, settings=Settings(reasoning="on"))
        rows += machine(agent + "-off", "Apple M1 Max", 25.1, off_, depth=2, settings=Settings(reasoning="off"))
    rows += machine("mbp-raw", "Apple M1 Max", 25.0, [30.0] * 5, depth=2)  # no switch recorded: not selected
    out = claims.evaluate(c, fleet_db(pd.DataFrame(rows))).set_index("differs")
    assert sorted(out.index) == ["reasoning=off", "reasoning=on"]
    levels = np.mean(np.log(list(levels_.values())))  # the machines' mean level
    on_figure, off_figure = (math.exp(np.mean(np.log(np.array(v) / b)) + levels) for v, b in ((on, 25.3), (off, 25.1)))
    assert out.loc["reasoning=on", "figure"] == pytest.approx(on_figure)
    assert out.loc["reasoning=off", "figure"] == pytest.approx(off_figure)
    assert (out.loc["reasoning=on", "verdict"], out.loc["reasoning=off", "verdict"]) == ("reproduced", "contradicted")
    assert (out["machines"] == 3).all()


def tps_claim(low: float, high: float) -> claims.Claim:
    return parse(
        conditions={"engine": "llama-server", "method": "draft-mtp", "chip": "Apple M1 Max", "depth": 3},
        metric="tokens_per_second",
        verdict={"rule": "range", "low": low, "high": high},
    )


def test_absolute_tokens_per_second_is_the_geometric_mean_of_machines_with_the_t_interval():
    speeds = {"mbp-1": [35.0, 36.0, 35.5, 34.8, 36.2], "mbp-2": [36.0, 35.5, 36.4, 35.9, 36.2],
              "mbp-3": [35.0, 35.6, 34.9, 35.2, 35.5]}  # fmt: skip
    rows = [r for agent, arm in speeds.items() for r in machine(agent, "Apple M1 Max", 25.3, arm)]
    runs = pd.DataFrame(rows)
    # by hand: machines x prompts crossed on log tok/s (specfleet/inference.py crossed_interval): the
    # machine part MS_m / (M P) and the shared prompt part max(0, MS_p - MS_e) / (M P); df M - 1 when
    # the machine part is at least the prompt part (Satterthwaite's, capped at the larger part's)
    table = np.log(np.array(list(speeds.values())))
    means = table.mean(axis=1)
    grand, cols = table.mean(), table.mean(axis=0)
    ms_m = 5 * np.sum((means - grand) ** 2) / 2
    ms_p = 3 * np.sum((cols - grand) ** 2) / 4
    ms_e = np.sum((table - means[:, None] - cols[None, :] + grand) ** 2) / 8
    a, b = ms_m / 15, max(ms_p - ms_e, 0.0) / 15
    assert a >= b
    half = sps.t.ppf(0.975, 2) * math.sqrt(a + b)
    (out,) = claims.evaluate(tps_claim(32.3, 39.5), fleet_db(runs)).itertuples()
    assert out.figure == pytest.approx(math.exp(means.mean()))
    assert (out.ci_low, out.ci_high) == (pytest.approx(math.exp(means.mean() - half)),
                                         pytest.approx(math.exp(means.mean() + half)))  # fmt: skip
    assert (out.verdict, out.machines, out.prompts, out.runs) == ("reproduced", 3, 5, 15)  # the arm's runs alone
    assert "tok/s" in out.why and not re.search(r"\dx\b", out.why), out.why  # speeds, never "35.5x"
    (far,) = claims.evaluate(tps_claim(20.0, 26.0), fleet_db(runs)).itertuples()
    assert far.verdict == "contradicted"  # the table's baseline speed: the log's arm is well above it
    (wide,) = claims.evaluate(tps_claim(35.5, 45.0), fleet_db(runs)).itertuples()
    assert wide.verdict == "inconclusive"  # the interval crosses the band's lower edge
    one = runs[runs["agent_id"] == "mbp-1"]
    (alone,) = claims.evaluate(tps_claim(32.3, 39.5), fleet_db(one)).itertuples()
    assert alone.verdict == "inconclusive" and alone.why.startswith("inconclusive: 1 of 3 machines")
    two = runs[runs["agent_id"] != "mbp-3"]  # one fewer than the simulated minimum
    (pair,) = claims.evaluate(tps_claim(32.3, 39.5), fleet_db(two)).itertuples()
    assert pair.verdict == "inconclusive" and pair.why.startswith("inconclusive: 2 of 3 machines")


def test_a_speed_the_source_read_off_the_servers_log_is_judged_on_the_servers_clock():
    """The bug report's 35.89 tok/s is llama-server's own `eval time` line: metric
    server_tokens_per_second judges the runs' server_decode_tokens_per_second (the server's final
    timings), the same estimator as the client's tok/s; a run the server gave no figure for is not
    selected, and the client's figure (here 8% below the server's: the stream's own cost) does not enter."""
    speeds = {"mbp-1": [35.0, 36.0, 35.5, 34.8, 36.2], "mbp-2": [36.0, 35.5, 36.4, 35.9, 36.2],
              "mbp-3": [35.0, 35.6, 34.9, 35.2, 35.5]}  # fmt: skip
    rows = [r for agent, arm in speeds.items() for r in machine(agent, "Apple M1 Max", 25.3, arm)]
    runs = pd.DataFrame(rows)
    runs["server_decode_tokens_per_second"] = runs["decode_tokens_per_second"]
    runs["decode_tokens_per_second"] *= 0.92  # the client's clock, beside the server's
    server = parse(
        conditions={"engine": "llama-server", "method": "draft-mtp", "chip": "Apple M1 Max", "depth": 3},
        metric="server_tokens_per_second",
        verdict={"rule": "range", "low": 32.3, "high": 39.5},
    )
    (out,) = claims.evaluate(server, fleet_db(runs)).itertuples()
    table = np.log(np.array(list(speeds.values())))
    assert out.figure == pytest.approx(math.exp(table.mean(axis=1).mean()))
    assert (out.verdict, out.machines, out.runs) == ("reproduced", 3, 15) and "tok/s" in out.why, out.why
    (client,) = claims.evaluate(tps_claim(32.3, 39.5), fleet_db(runs)).itertuples()
    assert client.figure == pytest.approx(out.figure * 0.92)  # the same runs on the client's clock
    unknown = runs.assign(server_decode_tokens_per_second=None)
    (none,) = claims.evaluate(server, fleet_db(unknown)).itertuples()
    assert none.verdict == "inconclusive" and none.runs == 0, none.why


def test_the_agent_records_its_machines_memory_in_gib():
    from agent import worker

    (cell,) = parse_sweep(yaml.safe_dump({"name": "m", "engines": ["mlx"], "prompt_sets": ["qa"],
                                          "models": {"mlx": {"target": "some-org/M-4bit"}}})).cells()  # fmt: skip
    assert cell.settings.memory_gb is None  # a sweep never sets it
    assert worker.resolved(cell, 24 * 2**30).settings.memory_gb == 24  # an M4 Pro 24 GB's hw.memsize
    assert worker.resolved(cell, int(15.6 * 2**30)).settings.memory_gb == 16  # Linux MemTotal, under the DIMMs
    assert worker.resolved(cell, None).settings.memory_gb is None  # unknown: recorded as unknown
    assert setting_problem(declared.BY_NAME["memory_gb"], worker.resolved(cell, 2**28).settings.memory_gb) == ""
