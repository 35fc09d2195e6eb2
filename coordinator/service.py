"""gRPC servicers: translate requests into calls on the scheduler, store and registry.

Every request, and every message of a stream, is checked against coordinator/limits.py
before anything else reads it: a field out of bounds is refused with INVALID_ARGUMENT naming
it, and nothing of the request is kept or stored.

Domain errors are answered with the status coordinator/errors.py's one table gives them
(`answered`). A write the store refuses for its own reasons (disk full, read-only file) answers
UNAVAILABLE (coordinator/store.py StoreUnavailable): the agent keeps what it sent and retries;
heartbeats are answered from memory meanwhile, and reads go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time

import grpc
import pyarrow as pa
from google.protobuf import json_format

from coordinator import agents, auth, limits, progress
from coordinator.batching import Batcher, Database
from coordinator.errors import answered
from coordinator.imports import store_imported
from coordinator.ingest import Report, ingest_many, readable_schema
from coordinator.metrics import Metrics
from coordinator.scheduler import (
    HEARTBEAT_INTERVAL_SECONDS,
    MAX_WAIT_SECONDS,
    Beat,
    Scheduler,
)
from coordinator.store import StoreUnavailable
from protos.specfleet.v1 import fleet_pb2 as pb
from protos.specfleet.v1 import fleet_pb2_grpc as pb_grpc
from specfleet.sweeps import parse_sweep

log = logging.getLogger("specfleet.coordinator")
MAX_EXPORT_ROWS = 50_000
# Export pages are Arrow IPC with zstd-compressed buffers (pyarrow's reader decompresses them):
# a page of 50k runs is 62 MB uncompressed, held as gRPC's buffer and its protobuf bytes at once.
EXPORT_IPC = pa.ipc.IpcWriteOptions(compression="zstd")
# Heartbeats are written this often: an agent's last contact in the table lags by up to this
# (agents beat every HEARTBEAT_INTERVAL_SECONDS), as does a lease's expiry, read only at restart.
FLUSH_SECONDS = 5.0
SHARED_POLL_SECONDS = 1.0  # how often a long-poll looks again on a lake other coordinators write
FLUSH_CHUNK = 100
# Results wait this long to share a transaction: a commit costs milliseconds, a row far less.
REPORT_LINGER_SECONDS = 0.005
# What the read path may show of each table: never credential hashes.
EXPORT_COLUMNS = {
    "runs": "*",
    "jobs": "job_id, sweep_id, agent_id, state, attempt, max_attempts, reason, created_at, updated_at, spec, seq",
    "sweeps": "sweep_id, name, state, created_at, yaml, seq, uncovered",
    "agents": "agent_id, name, chip, memory_bytes, state, status, current_job_id, labels, engines, fingerprint,"
    " enrolled_at, last_seen, seq",
    "imported_results": "*",
}
MAX_SHOWN_PROBLEMS = 20  # of a refused request, in its status
# Leases and heartbeats: an agent beats BEATS_PER_LEASE times a lease (every lease / 3, at most
# every HEARTBEAT_INTERVAL_SECONDS), never more often than every MIN_HEARTBEAT_SECONDS; a lease
# too short for that is refused when the coordinator starts (check_lease).
BEATS_PER_LEASE = 3
MIN_HEARTBEAT_SECONDS = 1.0


def heartbeat_interval(lease_seconds: float) -> float:
    """The interval agents are asked to beat at: a third of the lease, at most the default."""
    return min(HEARTBEAT_INTERVAL_SECONDS, lease_seconds / BEATS_PER_LEASE)


def check_lease(lease_seconds: float) -> None:
    """ValueError, in one line, for a lease that heartbeats cannot keep."""
    shortest = BEATS_PER_LEASE * MIN_HEARTBEAT_SECONDS
    if not lease_seconds >= shortest:  # NaN included
        raise ValueError(
            f"a lease of {lease_seconds:g} s is too short: agents beat {BEATS_PER_LEASE} times a lease, at most "
            f"every {MIN_HEARTBEAT_SECONDS:g} s, so a lease is at least {shortest:g} s (--lease-seconds)"
        )


def _fingerprint_dict(fp: pb.Fingerprint) -> dict:
    """The fingerprint as stored: without its hardware digest, of which only the fleet's salted
    hash is kept (agents.machine_of)."""
    out = json_format.MessageToDict(fp)
    out.pop("hardwareDigest", None)
    return out


async def bounded(request, context) -> None:
    """Abort the call with INVALID_ARGUMENT naming every field of `request` out of bounds."""
    problems = limits.problems(request)
    if problems:
        more = f"; and {len(problems) - MAX_SHOWN_PROBLEMS} more" if len(problems) > MAX_SHOWN_PROBLEMS else ""
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems[:MAX_SHOWN_PROBLEMS]) + more)


async def each_bounded(requests, context):
    """The messages of a request stream, each checked by `bounded` before it is handed on."""
    async for request in requests:
        await bounded(request, context)
        yield request


class AgentServicer(pb_grpc.AgentServiceServicer):
    """Agent calls on the event loop: store work runs on the database thread, results are
    batched into shared transactions, heartbeats are answered from memory and written every
    FLUSH_SECONDS, long-polls wait on the loop, not a thread."""

    def __init__(self, scheduler: Scheduler, metrics: Metrics, db: Database):
        self.scheduler = scheduler
        self.store = scheduler.store
        self.metrics = metrics
        self.db = db
        self.reports = Batcher(db, lambda reports: ingest_many(scheduler, reports), REPORT_LINGER_SECONDS)
        self.waiters = Waiters()
        scheduler.listeners.append(self.waiters.notify_threadsafe)
        # Each agent's latest heartbeat, written with the others every FLUSH_SECONDS (leases
        # are extended at once, in memory). Draining is set only through this process.
        self.beats: dict[str, Beat] = {}
        with self.store.tx() as con:
            self.draining = {
                a for (a,) in con.execute("SELECT agent_id FROM agents WHERE state = 'draining'").fetchall()
            }

    def set_state(self, agent_id: str, state: str) -> None:
        """Told by the admin service after it changed an agent's state."""
        if state == "draining":
            self.draining.add(agent_id)
        else:
            self.draining.discard(agent_id)

    def keep_beat(self, beat: Beat) -> None:
        """Keep the agent's latest beat for the next flush, and a fingerprint an earlier one sent."""
        earlier = self.beats.get(beat.agent_id)
        if beat.fingerprint is None and earlier is not None and earlier.fingerprint is not None:
            beat = dataclasses.replace(beat, fingerprint=earlier.fingerprint)
        self.beats[beat.agent_id] = beat

    async def flush_beats(self) -> None:
        """Write the heartbeats kept since the last flush, a chunk per call on the database
        thread: results queued meanwhile go between the chunks instead of waiting for all.
        Beats of a chunk whose write failed are kept for the next flush, unless a newer beat
        of the same agent came meanwhile."""
        beats, self.beats = list(self.beats.values()), {}
        for first in range(0, max(len(beats), 1), FLUSH_CHUNK):  # at least once: lease expiries
            try:
                await self.db.run(self.scheduler.record_beats, beats[first : first + FLUSH_CHUNK])
                if beats:
                    self.store.wrote()
            except BaseException:
                for beat in beats[first:]:
                    if beat.agent_id not in self.beats:
                        self.keep_beat(beat)
                    elif self.beats[beat.agent_id].fingerprint is None and beat.fingerprint is not None:
                        self.beats[beat.agent_id] = dataclasses.replace(
                            self.beats[beat.agent_id], fingerprint=beat.fingerprint
                        )
                raise

    async def flush_beats_forever(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            try:
                await self.flush_beats()
            except StoreUnavailable:  # logged by the store, once; the next flush tries again
                pass
            except Exception:  # the next flush writes the next beats; an agent's last_seen lags
                log.exception("writing heartbeats failed")

    async def Enrol(self, request, context):
        await bounded(request, context)
        async with answered(context):
            agent_id, credential = await self.db.run(
                agents.enrol,
                self.store,
                request.token,
                request.name,
                _fingerprint_dict(request.fingerprint),
                dict(request.labels),
                list(request.engines),
                None,  # now: the store's clock
                request.fingerprint.hardware_digest,
            )
        return pb.EnrolResponse(
            agent_id=agent_id,
            credential=credential,
            heartbeat_interval_seconds=heartbeat_interval(self.scheduler.lease_seconds),
            lease_seconds=self.scheduler.lease_seconds,
            max_record_schema=readable_schema(),
        )

    async def Heartbeat(self, requests, context):
        """An agent's heartbeat stream: one answer per beat, in order."""
        agent_id = auth.current_agent.get()
        async with answered(context):
            async for response in self._beats(agent_id, requests, context):
                yield response

    async def _beats(self, agent_id: str, requests, context):
        async for request in each_bounded(requests, context):
            response = self.beat(agent_id, request)
            if request.job_id and not response.lease_valid:  # lapsed while the agent was out of reach?
                remaining = await self.db.run(self.scheduler.reclaim, agent_id, request.job_id, request.lease_id)
                if remaining is not None:
                    log.info("agent %s re-claimed its lapsed lease on %s", agent_id, request.job_id)
                    response.lease_valid, response.lease_expires_in_seconds = True, remaining
            yield response

    def beat(self, agent_id: str, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        """Keep the beat for the next flush and extend the agent's lease, in memory (the stream
        re-claims a lapsed one: Heartbeat)."""
        fingerprint = _fingerprint_dict(request.fingerprint) if request.HasField("fingerprint") else None
        self.keep_beat(Beat(agent_id, request.job_id, request.lease_id, request.status, fingerprint))
        response = pb.HeartbeatResponse(drain=agent_id in self.draining, max_record_schema=readable_schema())
        if request.job_id:
            remaining = self.scheduler.extend_lease(agent_id, request.job_id, request.lease_id)
            response.lease_valid = remaining is not None
            response.lease_expires_in_seconds = remaining or 0.0
        return response

    async def AcquireJob(self, request, context):
        await bounded(request, context)
        agent_id = auth.current_agent.get()
        wait = min(max(request.wait_seconds, 0.0), MAX_WAIT_SECONDS)
        if context.time_remaining() is not None:  # answer before the caller's own deadline
            wait = min(wait, max(context.time_remaining() - 1.0, 0.0))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        with self.waiters.waiting(agent_id) as woken:  # listen before looking: no wake-up is missed
            self.keep_beat(Beat(agent_id, status="waiting for a job"))
            job = await self.try_acquire(agent_id, context)
            while job is None and (remaining := deadline - loop.time()) > 0:
                if self.scheduler.shared:  # a job queued by another coordinator wakes no one here
                    remaining = min(remaining, SHARED_POLL_SECONDS)
                try:
                    async with asyncio.timeout(remaining):  # no task of its own, unlike wait_for
                        await woken.wait()
                except TimeoutError:
                    if not self.scheduler.shared:
                        break
                woken.clear()
                job = await self.try_acquire(agent_id, context)
        if job is None:
            return pb.AcquireJobResponse(has_job=False, max_record_schema=readable_schema())
        return pb.AcquireJobResponse(
            has_job=True,
            max_record_schema=readable_schema(),
            job=pb.Job(
                job_id=job.job_id,
                lease_id=job.lease_id,
                sweep_id=job.sweep_id,
                attempt=job.attempt,
                lease_seconds=self.scheduler.lease_seconds,
                spec_json=json.dumps(job.spec),
            ),
        )

    async def try_acquire(self, agent_id: str, context):
        if not self.scheduler.may_have_work(agent_id):  # most polls: answered without the database
            return None
        async with answered(context):  # a store refusing writes: UNAVAILABLE, retried
            return await self.db.run(self.scheduler.try_acquire, agent_id)

    async def ReportResult(self, requests, context):
        """An agent's result stream: one answer per run, in order; a refused run ends it."""
        agent_id = auth.current_agent.get()
        async for request in each_bounded(requests, context):
            async with answered(context):  # a NewerRun is held by the agent, not parked (errors.py)
                duplicate, seq = await self.reports.submit(
                    Report(agent_id, request.job_id, request.lease_id, request.record_json, time.time())
                )
            (self.metrics.runs_duplicate if duplicate else self.metrics.runs_ingested).inc()
            yield pb.ReportResultResponse(duplicate=duplicate, ingest_seq=seq)

    async def CompleteJob(self, request, context):
        await bounded(request, context)
        async with answered(context):
            await self.db.run(
                self.scheduler.complete,
                auth.current_agent.get(),
                request.job_id,
                request.lease_id,
                request.run_count,
                request.held_runs,
            )
        return pb.CompleteJobResponse()

    async def FailJob(self, request, context):
        """A failed attempt (retried while attempts remain), or a refused job (never retried)."""
        await bounded(request, context)
        agent_id, reason = auth.current_agent.get(), request.reason or "no reason given"
        async with answered(context):
            if request.refused:
                await self.db.run(self.scheduler.refuse, agent_id, request.job_id, request.lease_id, reason)
                return pb.FailJobResponse(will_retry=False)
            retry = await self.db.run(self.scheduler.fail, agent_id, request.job_id, request.lease_id, reason, True)
        return pb.FailJobResponse(will_retry=retry)

    async def Ping(self, request, context):
        """The agent's id and name (its credential passed the interceptor) and the coordinator's
        clock, for `specfleet agent doctor`; nothing is written."""
        await bounded(request, context)
        agent_id = auth.current_agent.get()
        name = await self.db.run(self._name, agent_id)
        return pb.PingResponse(agent_id=agent_id, name=name, server_time_unix_seconds=time.time())

    def _name(self, agent_id: str) -> str:
        with self.store.tx() as con:
            row = con.execute("SELECT name FROM agents WHERE agent_id = ?", [agent_id]).fetchone()
        return row[0] if row else ""


class Waiters:
    """The agents waiting in AcquireJob, each with an event the scheduler's wake-ups set."""

    def __init__(self):
        self._events: dict[str, set[asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.contextmanager
    def waiting(self, agent_id: str):
        self._loop = asyncio.get_running_loop()
        event = asyncio.Event()
        self._events.setdefault(agent_id, set()).add(event)
        try:
            yield event
        finally:
            events = self._events[agent_id]
            events.discard(event)
            if not events:
                del self._events[agent_id]

    def notify_threadsafe(self, agent_ids: set[str]) -> None:
        """Called by the scheduler, from whichever thread changed the jobs."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._notify, agent_ids)

    def _notify(self, agent_ids: set[str]) -> None:
        for agent_id in agent_ids:
            for event in self._events.get(agent_id, ()):
                event.set()


class AdminServicer(pb_grpc.AdminServiceServicer):
    def __init__(self, scheduler: Scheduler, db: Database, credentials: auth.Credentials, agent_service: AgentServicer):
        self.scheduler = scheduler
        self.store = scheduler.store
        self.db = db
        self.credentials = credentials
        self.agent_service = agent_service

    async def CreateToken(self, request, context):
        await bounded(request, context)
        async with answered(context):
            token, expires_at = await self.db.run(
                auth.create_token, self.store, request.ttl_seconds or 3600.0, request.max_uses or 1, request.note
            )
        return pb.CreateTokenResponse(token=token, expires_at_unix_seconds=expires_at)

    async def ListAgents(self, request, context):
        await bounded(request, context)
        return await self.db.run(self._list_agents)

    def _list_agents(self) -> pb.ListAgentsResponse:
        with self.store.tx() as con:
            rows = con.execute(
                "SELECT agent_id, name, state, fingerprint, labels, engines, last_seen, current_job_id, status"
                " FROM agents ORDER BY name"
            ).fetchall()
        out = pb.ListAgentsResponse()
        for agent_id, name, state, fp, labels, engines, last_seen, job, status in rows:
            out.agents.append(
                pb.Agent(
                    agent_id=agent_id,
                    name=name,
                    state=state,
                    fingerprint=json_format.ParseDict(json.loads(fp), pb.Fingerprint()),
                    labels=json.loads(labels),
                    engines=json.loads(engines),
                    last_seen_unix_seconds=last_seen,
                    current_job_id=job or "",
                    status=status,
                )
            )
        return out

    async def SubmitSweep(self, request, context):
        await bounded(request, context)
        async with answered(context):
            # Off the event loop: a sweep's parsing is bounded (specfleet/yaml_limits.py), but
            # heartbeats must not wait even those milliseconds.
            sweep = await asyncio.to_thread(parse_sweep, request.yaml)
            sweep_id, jobs = await self.db.run(self.scheduler.submit, sweep, request.yaml)
        (status,) = await self.db.run(self._statuses, sweep_id)
        return pb.SubmitSweepResponse(sweep_id=sweep_id, jobs=jobs, notes=sweep.notes(), uncovered=status.uncovered)

    async def GetSweep(self, request, context):
        await bounded(request, context)
        statuses = await self.db.run(self._statuses, request.sweep_id)
        if not statuses:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown sweep {request.sweep_id}")
        return statuses[0]

    async def ListSweeps(self, request, context):
        await bounded(request, context)
        return pb.ListSweepsResponse(sweeps=await self.db.run(self._statuses, None))

    async def CancelSweep(self, request, context):
        await bounded(request, context)
        async with answered(context):
            cancelled = await self.db.run(self.scheduler.cancel, request.sweep_id)
        return pb.CancelSweepResponse(jobs_cancelled=cancelled)

    async def SetAgentState(self, request, context):
        """Revoke, drain or undrain ("idle") an agent; once committed, the credential cache
        and the drain flag heartbeats answer with follow. The beats kept for the next flush are
        written first, so the change starts from the state the agent last reported (an agent that
        has beaten is idle, not "enrolled", though the flush was up to FLUSH_SECONDS away)."""
        await bounded(request, context)
        async with answered(context):
            await self.agent_service.flush_beats()
            state = await self.db.run(agents.set_state, self.scheduler, request.agent_id, request.state)
        self.credentials.forget(request.agent_id)
        self.agent_service.set_state(request.agent_id, state)
        return pb.SetAgentStateResponse()

    async def ImportResults(self, request, context):
        """Store results another tool measured, all in one transaction or none, as the admin
        whose credential the call carries."""
        await bounded(request, context)
        imported_by = auth.admin_identity(context.invocation_metadata())
        async with answered(context):
            stored, duplicates = await self.db.run(store_imported, self.store, request, imported_by)
        return pb.ImportResultsResponse(stored=stored, duplicates=duplicates, imported_by=imported_by)

    async def Export(self, request, context):
        await bounded(request, context)
        columns = EXPORT_COLUMNS.get(request.table)
        if columns is None:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown table {request.table!r} (known: {', '.join(EXPORT_COLUMNS)})",
            )
        # Off the database thread, on a connection of its own: a mirror's first sync of a
        # million runs (20 pages) holds up no ingest.
        return await asyncio.to_thread(self._export, request, columns)

    def _export(self, request, columns: str) -> pb.ExportResponse:
        limit = min(request.limit or MAX_EXPORT_ROWS, MAX_EXPORT_ROWS)
        with self.store.reader() as con:
            table = con.sql(
                # Table and column names come from EXPORT_COLUMNS, never from the request.
                f"SELECT {columns} FROM {request.table} WHERE seq > ? ORDER BY seq LIMIT ?",
                params=[request.after_seq, limit],
            ).to_arrow_table()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema, options=EXPORT_IPC) as writer:
            writer.write_table(table)
        last = table.column("seq")[-1].as_py() if table.num_rows else request.after_seq
        return pb.ExportResponse(arrow_ipc=sink.getvalue().to_pybytes(), last_seq=last, rows=table.num_rows)

    def _statuses(self, sweep_id: str | None) -> list[pb.SweepStatus]:
        where, args = ("WHERE s.sweep_id = ?", [sweep_id]) if sweep_id is not None else ("", [])
        with self.store.tx() as con:
            rows = con.execute(
                "SELECT s.sweep_id, s.name, s.state, s.created_at,"
                " count(j.job_id),"
                " count(j.job_id) FILTER (WHERE j.state = 'queued'),"
                " count(j.job_id) FILTER (WHERE j.state = 'leased'),"
                " count(j.job_id) FILTER (WHERE j.state = 'done'),"
                # Refused jobs count with the failed ones (what every reader of jobs_failed
                # expects), and apart in jobs_refused; their reason in `failures` says "refused: ...".
                " count(j.job_id) FILTER (WHERE j.state IN ('failed', 'refused')),"
                " (SELECT count(*) FROM runs r WHERE r.sweep_id = s.sweep_id),"
                " list(j.job_id || ': ' || j.reason) FILTER (WHERE j.state IN ('failed', 'refused')),"
                " count(j.job_id) FILTER (WHERE j.state = 'refused'), s.uncovered,"
                " count(j.job_id) FILTER (WHERE j.state = 'held'),"
                " (SELECT coalesce(sum(a.runs_held), 0) FROM attempts a JOIN jobs h USING (job_id)"
                "  WHERE h.sweep_id = s.sweep_id AND h.state = 'held' AND a.outcome = 'held')"
                f" FROM sweeps s LEFT JOIN jobs j USING (sweep_id) {where}"
                " GROUP BY ALL ORDER BY s.created_at DESC",
                args,
            ).fetchall()
            more = progress.sweep_progress(con, [r[0] for r in rows if r[2] == "running"])
        ended = progress.SweepProgress(runs_expected=0, eta_seconds=0.0, agents=[])
        return [
            pb.SweepStatus(
                sweep_id=r[0],
                name=r[1],
                state=r[2],
                created_at_unix_seconds=r[3],
                jobs_total=r[4],
                jobs_queued=r[5],
                jobs_running=r[6],
                jobs_done=r[7],
                jobs_failed=r[8],
                jobs_refused=r[11],
                uncovered=r[12] or [],
                jobs_held=r[13],
                runs_held=r[14],
                runs=r[9],
                failures=r[10] or [],
                runs_expected=more[r[0]].runs_expected if r[0] in more else r[9],
                eta_seconds=-1.0 if (eta := more.get(r[0], ended).eta_seconds) is None else eta,
                agents=[pb.AgentProgress(**dataclasses.asdict(a)) for a in more.get(r[0], ended).agents],
            )
            for r in rows
        ]
