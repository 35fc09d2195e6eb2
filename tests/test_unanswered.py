"""DEADLINE_EXCEEDED is counted apart from a network cut (issue 31, item 7): a coordinator that
answers a Ping but never answers one record gets that record parked after the upload budget's
refusals, the records behind it go up; with the network cut (no Ping answered either) nothing
is parked and the record is retried as long as it takes."""

import json
import threading

import grpc
import pytest

from agent import retry, upload
from agent.metrics import AgentMetrics
from agent.spool import Spool
from agent.upload import Uploader
from tests.support.fleet import run_record

Code = grpc.StatusCode
GIVE_UP_CALLS = 40  # a fake that is asked this often for one record ends the test: retried forever


class Refused(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "no"):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return ()


class HangingApi:
    """Times out on every upload of the run ids in `hangs_on` (and on every call, Ping too,
    while `cut`); stores the others."""

    def __init__(self, hangs_on: set[str], stop: threading.Event, cut: bool = False):
        self.hangs_on, self.stop, self.cut = hangs_on, stop, cut
        self.stored, self.calls, self.pings = [], {}, 0

    def report_result(self, job_id, lease_id, record_json):
        run_id = json.loads(record_json)["run_id"]
        self.calls[run_id] = self.calls.get(run_id, 0) + 1
        if self.calls[run_id] >= GIVE_UP_CALLS:
            self.stop.set()  # the uploader would go on for ever: end it
        if self.cut or run_id in self.hangs_on:
            raise Refused(Code.DEADLINE_EXCEEDED, "no result answer in 30 s")
        self.stored.append(run_id)

    def ping(self, timeout):
        self.pings += 1
        if self.cut:
            raise Refused(Code.UNAVAILABLE, "failed to connect to all addresses")


@pytest.fixture(autouse=True)
def quick_budget(monkeypatch):
    """The upload budget's shape, without its seconds: no test here waits for a backoff."""
    monkeypatch.setattr(upload, "UPLOAD", retry.Budget(0.001, 0.001, float("inf"), max_refusals=5))


def test_a_record_the_coordinator_hangs_on_is_parked_and_the_others_go_up(tmp_path):
    records, stop = Spool(tmp_path / "spool"), threading.Event()
    runs = [run_record("job-1") for _ in range(3)]
    for run in runs:
        records.put("job-1", "lease-1", run)
    poison = runs[1].run_id
    api = HangingApi({poison}, stop)
    uploader = Uploader(api, records, stop, AgentMetrics(records.depth))
    assert uploader.flush() == 2
    assert not stop.is_set(), f"the hanging record was retried {api.calls[poison]} times: as a network cut"
    assert sorted(api.stored) == sorted(r.run_id for r in runs if r.run_id != poison)
    assert api.calls[poison] == 5 and api.pings >= 5
    (parked,) = uploader.parked
    assert parked.run_id == poison and parked.reason.startswith("DEADLINE_EXCEEDED")
    assert "unanswered 5 times while the coordinator answered a Ping" in parked.reason
    assert [p.run_id for p in records.parked()] == [poison] and records.depth() == 0


def test_a_network_cut_parks_nothing_and_keeps_retrying(tmp_path):
    records, stop = Spool(tmp_path / "spool"), threading.Event()
    run = run_record("job-1")
    records.put("job-1", "lease-1", run)
    api = HangingApi(set(), stop, cut=True)
    uploader = Uploader(api, records, stop, AgentMetrics(records.depth))
    with pytest.raises(InterruptedError):
        uploader.flush()  # ends only because the fake stops the agent after GIVE_UP_CALLS tries
    assert api.calls[run.run_id] == GIVE_UP_CALLS and not uploader.parked and records.depth() == 1
    api.cut = False  # the network is back: the record goes up
    stop.clear()
    assert uploader.flush() == 1 and api.stored == [run.run_id]


def test_retry_counts_deadline_exceeded_as_a_refusal_only_while_the_coordinator_answers():
    now = [0.0]
    clock = retry.Clock(now=lambda: now[0], sleep=lambda s, stop: now.__setitem__(0, now[0] + s), jitter=lambda a, b: b)
    budget = retry.Budget(0.5, 5.0, float("inf"), max_refusals=3)
    calls = []

    def hangs():
        calls.append(1)
        if len(calls) > 50:
            return "answered at last"
        raise Refused(Code.DEADLINE_EXCEEDED)

    with pytest.raises(retry.Unanswered) as e:
        retry.call(hangs, budget, "upload", clock=clock, answers=lambda: True)
    assert len(calls) == 3 and e.value.code() == Code.DEADLINE_EXCEEDED
    calls.clear()
    assert retry.call(hangs, budget, "upload", clock=clock, answers=lambda: False) == "answered at last"
    calls.clear()
    assert retry.call(hangs, budget, "upload", clock=clock) == "answered at last"  # no probe: as before
