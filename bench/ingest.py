"""How fast are records validated, and does storing a batch of results get slower as the runs table grows?

First, run records validated per second (`RunRecord.from_json`, what ingest and the spool do per
upload), by this checkout's record module and, side by side in the same process, by the record
module as it was before pydantic (`git show BEFORE:specfleet/record.py`, its hand-written checks),
with their ratio. Then it stores batches of 60 runs (what the coordinator's ingest batches hold at 600 results/s) into a
real DuckDB file holding N runs already, for N = 10,000 and 1,000,000, and prints the median
time of `ingest_many` beside the retry lookup written the two ways it can be: `IN (?, ?, ...)`
(what ingest uses: answered from the primary-key index) and `IN (SELECT unnest(?))` (a join,
which scans the whole table).

    .venv/bin/python bench/ingest.py [--validation-only]
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coordinator import agents, auth  # noqa: E402
from coordinator.ingest import Report, ingest_many  # noqa: E402
from coordinator.scheduler import Scheduler  # noqa: E402
from coordinator.store import Store, placeholders  # noqa: E402
from specfleet import record  # noqa: E402
from specfleet.sweeps import parse_sweep  # noqa: E402
from tests.support.fleet import make_run, run_id  # noqa: E402

BATCH = 60
REPEATS = 15
# The last commit whose record module validated by hand (before specfleet/schemas.py).
BEFORE = "8978ce0"
VALIDATED = 2000  # records per timing


def record_module_before():
    """specfleet/record.py as of BEFORE, imported under another name."""
    text = subprocess.run(
        ["git", "show", f"{BEFORE}:specfleet/record.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "record_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("record_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["record_before"] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def validated_per_second(module, texts: list[str]) -> float:
    """Median records per second that `module.RunRecord.from_json` reads and validates."""
    return len(texts) / (median_ms(lambda: [module.RunRecord.from_json(t) for t in texts]) / 1000)


def validation() -> None:
    texts = [
        make_run(f"job-{i}", method="draft", depth=3, tokens_drafted=30, tokens_accepted=20) for i in range(VALIDATED)
    ]
    before, after = record_module_before(), record
    rates = {}
    for _ in range(3):  # alternated, so that a busy moment falls on both
        for name, module in (("before", before), ("after", after)):
            rates.setdefault(name, []).append(validated_per_second(module, texts))
    b, a = statistics.median(rates["before"]), statistics.median(rates["after"])
    print(f"run records validated per second (RunRecord.from_json, {VALIDATED} records, median of 3 alternated)")
    print(f"{'hand-written (' + BEFORE + ')':28}{'pydantic (this checkout)':>26}{'ratio':>8}")
    print(f"{b:28,.0f}{a:26,.0f}{a / b:8.2f}")


def median_ms(fn) -> float:
    fn()  # warm
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def measure(stored: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp))
        scheduler = Scheduler(store)
        token, _ = auth.create_token(store, 60, 1)
        agent, _ = agents.enrol(store, token, "mac", {"chip": "Apple M4", "memoryBytes": str(2**35)}, {}, ["mlx"])
        sweep = {"name": "s", "models": {"mlx": {"target": "/m"}}, "engines": ["mlx"], "prompt_sets": ["code"]}
        scheduler.submit(parse_sweep(json.dumps(sweep)), json.dumps(sweep))
        job = scheduler.acquire(agent)
        (first,) = ingest_many(scheduler, [Report(agent, job.job_id, job.lease_id, make_run(job.job_id))])
        with store.tx() as con:  # the stored history: other jobs' runs, copies of that one
            con.execute(
                "INSERT INTO runs SELECT r.* REPLACE (uuid()::VARCHAR AS run_id, 'job-old' AS job_id,"
                " nextval('ingest_seq') AS seq) FROM (SELECT * FROM runs LIMIT 1) r, range(?)",
                [stored],
            )

        def ingest():
            reports = [Report(agent, job.job_id, job.lease_id, make_run(job.job_id)) for _ in range(BATCH)]
            assert all(isinstance(r, tuple) for r in ingest_many(scheduler, reports))

        run_ids = [run_id(make_run(job.job_id)) for _ in range(BATCH)]

        with store.tx() as con:
            in_list = median_ms(
                lambda: con.execute(f"SELECT seq FROM runs WHERE run_id IN {placeholders(run_ids)}", run_ids).fetchall()
            )
            unnest = median_ms(
                lambda: con.execute("SELECT seq FROM runs WHERE run_id IN (SELECT unnest(?))", [run_ids]).fetchall()
            )
        result = {"ingest_many": median_ms(ingest), "IN (?, ...)": in_list, "IN (SELECT unnest(?))": unnest}
        store.close()
        return result


def main() -> int:
    validation()
    if "--validation-only" in sys.argv[1:]:
        return 0
    print()
    sizes = (10_000, 1_000_000)
    results = {n: measure(n) for n in sizes}
    print(f"median ms per batch of {BATCH} runs, by runs already stored")
    print(f"{'':28}" + "".join(f"{n:>12,}" for n in sizes) + f"{'ratio':>8}")
    for name in results[sizes[0]]:
        a, b = (results[n][name] for n in sizes)
        print(f"{name:28}{a:12.2f}{b:12.2f}{b / a:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
