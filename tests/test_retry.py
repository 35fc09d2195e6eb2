"""retry.call's budgets, the heartbeat's jitter and the streams' timeouts, on a fake clock: no
test here sleeps."""

import threading

import grpc
import pytest

from agent import heartbeat, retry, upload
from specfleet.client import CallStream, StreamError
from tests.support.clocks import FakeClock

Code = grpc.StatusCode


class Refused(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "no"):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


def answers(*outcomes):
    """fn() for retry.call: raises or returns each outcome in turn, counting the calls."""
    pending = list(outcomes)

    def fn():
        fn.calls += 1
        outcome = pending.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    fn.calls = 0
    return fn


def test_unreachable_is_retried_with_doubling_delays_up_to_the_cap():
    fake = FakeClock()
    fn = answers(*[Refused(Code.UNAVAILABLE)] * 5, "ok")
    assert retry.call(fn, retry.Budget(0.5, 3.0, 100.0), "x", clock=fake.retry_clock()) == "ok"
    assert fake.sleeps == [0.5, 1.0, 2.0, 3.0, 3.0] and fn.calls == 6


def test_the_budget_s_time_is_spent_then_the_last_error_is_raised():
    fake = FakeClock()
    fn = answers(*[Refused(Code.DEADLINE_EXCEEDED)] * 100)
    with pytest.raises(grpc.RpcError) as raised:
        retry.call(fn, heartbeat.HEARTBEAT, "heartbeat", clock=fake.retry_clock())
    assert raised.value.code() == Code.DEADLINE_EXCEEDED
    assert sum(fake.sleeps) <= heartbeat.HEARTBEAT.give_up_after_seconds < sum(fake.sleeps) + 5.0


def test_uploads_outlast_any_outage_but_not_a_coordinator_that_refuses_the_record():
    fake = FakeClock()
    fn = answers(*[Refused(Code.UNAVAILABLE)] * 1500, "stored")
    assert retry.call(fn, upload.UPLOAD, "upload", clock=fake.retry_clock()) == "stored"
    assert sum(fake.sleeps) > 24 * 3600  # a day's outage

    refusals = [Refused(Code.RESOURCE_EXHAUSTED, "larger than max"), Refused(Code.UNAVAILABLE)] * 10
    fn = answers(*refusals)
    with pytest.raises(grpc.RpcError) as raised:
        retry.call(fn, upload.UPLOAD, "upload", clock=FakeClock().retry_clock())
    assert fn.calls == 2 * upload.UPLOAD.max_refusals - 1  # the outages between count for nothing
    assert retry.refusal(raised.value, upload.UPLOAD) == "RESOURCE_EXHAUSTED: larger than max (refused 5 times)"


def test_fatal_and_non_retryable_errors_are_not_retried():
    fake = FakeClock()
    with pytest.raises(retry.FatalApiError, match="enrol: UNAUTHENTICATED: revoked"):
        retry.call(answers(Refused(Code.UNAUTHENTICATED, "revoked")), retry.ENROL, "enrol", clock=fake.retry_clock())
    with pytest.raises(grpc.RpcError) as raised:
        retry.call(answers(Refused(Code.INVALID_ARGUMENT, "bad")), upload.UPLOAD, "upload", clock=fake.retry_clock())
    assert fake.sleeps == [] and retry.refusal(raised.value, upload.UPLOAD) == "INVALID_ARGUMENT: bad"


def test_a_stop_ends_the_wait_between_tries():
    stop = threading.Event()
    stop.set()
    with pytest.raises(InterruptedError, match="acquire: agent stopping"):
        retry.call(answers(Refused(Code.UNAVAILABLE)), retry.ENROL, "acquire", stop, clock=FakeClock().retry_clock())


def test_heartbeats_wait_the_interval_less_up_to_a_fifth():
    assert heartbeat.next_wait(10.0, jitter=lambda low, high: low) == pytest.approx(8.0)
    assert heartbeat.next_wait(10.0, jitter=lambda low, high: high) == 10.0
    waits = {heartbeat.next_wait(10.0) for _ in range(50)}
    assert len(waits) > 1 and all(8.0 <= w <= 10.0 for w in waits)


class FakeStream:
    """A response stream: answers (or refusals, raised) in turn, then ends; cancel() makes the
    next read fail."""

    def __init__(self, replies):
        self.replies, self.cancelled = list(replies), False

    def __next__(self):
        if self.cancelled:
            raise Refused(Code.CANCELLED, "cancelled")
        if not self.replies:
            raise StopIteration
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def cancel(self):
        self.cancelled = True


class FakeTimer:
    """threading.Timer's shape; `fires` says whether it runs its function when started (the
    call's timeout passed before any answer)."""

    fires = False
    started: list = []

    def __init__(self, seconds, fn):
        self.seconds, self.fn, self.cancelled = seconds, fn, False
        FakeTimer.started.append(self)

    def start(self):
        if FakeTimer.fires:
            self.fn()

    def cancel(self):
        self.cancelled = True


@pytest.fixture
def streams():
    FakeTimer.fires, FakeTimer.started = False, []
    opened = []

    def method(requests, metadata):
        opened.append(FakeStream(method.replies.pop(0)))
        return opened[-1]

    method.replies = []
    return method, opened


def test_a_stream_answers_calls_in_order_on_one_stream_and_cancels_each_timer(streams):
    method, opened = streams
    method.replies = [["first", "second"]]
    calls = CallStream(method, (), "heartbeat", timer=FakeTimer)
    assert calls.call("a") == "first" and calls.call("b", timeout=5.0) == "second"
    assert len(opened) == 1
    assert [t.seconds for t in FakeTimer.started] == [30.0, 5.0] and all(t.cancelled for t in FakeTimer.started)


def test_a_call_unanswered_in_time_raises_deadline_exceeded_and_the_next_opens_a_new_stream(streams):
    method, opened = streams
    method.replies = [["late"], ["fresh"]]
    calls = CallStream(method, (), "heartbeat", timer=FakeTimer)
    FakeTimer.fires = True
    with pytest.raises(StreamError) as raised:
        calls.call("a", timeout=7.0)
    assert raised.value.code() == Code.DEADLINE_EXCEEDED and raised.value.details() == "no heartbeat answer in 7 s"
    assert opened[0].cancelled
    FakeTimer.fires = False
    assert calls.call("b") == "fresh" and len(opened) == 2


def test_a_stream_the_coordinator_ended_is_unavailable_and_a_refusal_passes_through(streams):
    method, opened = streams
    method.replies = [[], [Refused(Code.INVALID_ARGUMENT, "unknown field")], ["stored"]]
    calls = CallStream(method, (), "result", timer=FakeTimer)
    with pytest.raises(StreamError) as raised:
        calls.call("a")
    assert raised.value.code() == Code.UNAVAILABLE and "ended the result stream" in raised.value.details()
    with pytest.raises(Refused, match="unknown field"):
        calls.call("b")
    assert calls.call("c") == "stored" and len(opened) == 3  # a refusal closed its stream
