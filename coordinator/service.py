"""gRPC servicers: translate requests into calls on the scheduler, store and registry."""

from __future__ import annotations

import json

import grpc
import pyarrow as pa
from google.protobuf import json_format

from coordinator import agents, auth
from coordinator.ingest import InvalidRun, ingest
from coordinator.metrics import Metrics
from coordinator.scheduler import HEARTBEAT_INTERVAL_SECONDS, NoMatchingAgents, Scheduler, SchedulerError
from coordinator.sweeps import SweepError, parse_sweep
from protos.specfleet.v1 import fleet_pb2 as pb
from protos.specfleet.v1 import fleet_pb2_grpc as pb_grpc

MAX_EXPORT_ROWS = 50_000
# What the read path may show of each table: never credential hashes.
EXPORT_COLUMNS = {
    "runs": "*",
    "jobs": "job_id, sweep_id, agent_id, state, attempt, max_attempts, reason, created_at, updated_at, spec, seq",
    "sweeps": "sweep_id, name, state, created_at, yaml, seq",
    "agents": "agent_id, name, chip, memory_bytes, state, status, current_job_id, labels, engines, fingerprint,"
    " enrolled_at, last_seen, seq",
}


def _fingerprint_dict(fp: pb.Fingerprint) -> dict:
    return json_format.MessageToDict(fp)


class AgentServicer(pb_grpc.AgentServiceServicer):
    def __init__(self, scheduler: Scheduler, metrics: Metrics):
        self.scheduler = scheduler
        self.store = scheduler.store
        self.metrics = metrics

    def Enrol(self, request, context):
        try:
            agent_id, credential = agents.enrol(
                self.store,
                request.token,
                request.name,
                _fingerprint_dict(request.fingerprint),
                dict(request.labels),
                list(request.engines),
            )
        except auth.AuthError as e:
            context.abort(e.code, str(e))
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return pb.EnrolResponse(
            agent_id=agent_id,
            credential=credential,
            heartbeat_interval_seconds=HEARTBEAT_INTERVAL_SECONDS,
            lease_seconds=self.scheduler.lease_seconds,
        )

    def Heartbeat(self, request, context):
        agent_id = auth.current_agent.get()
        fingerprint = _fingerprint_dict(request.fingerprint) if request.HasField("fingerprint") else None
        state = agents.touch(self.store, agent_id, request.status, fingerprint)
        response = pb.HeartbeatResponse(drain=state == "draining")
        if request.job_id:
            remaining = self.scheduler.heartbeat(agent_id, request.job_id, request.lease_id)
            response.lease_valid = remaining is not None
            response.lease_expires_in_seconds = remaining or 0.0
        return response

    def AcquireJob(self, request, context):
        agent_id = auth.current_agent.get()
        agents.touch(self.store, agent_id, "waiting for a job")
        wait = request.wait_seconds
        if context.time_remaining() is not None:  # answer before the caller's own deadline
            wait = min(wait, max(context.time_remaining() - 1.0, 0.0))
        job = self.scheduler.acquire(agent_id, wait)
        if job is None:
            return pb.AcquireJobResponse(has_job=False)
        return pb.AcquireJobResponse(
            has_job=True,
            job=pb.Job(
                job_id=job.job_id,
                lease_id=job.lease_id,
                sweep_id=job.sweep_id,
                attempt=job.attempt,
                lease_seconds=self.scheduler.lease_seconds,
                spec_json=json.dumps(job.spec),
            ),
        )

    def ReportResult(self, request, context):
        agent_id = auth.current_agent.get()
        try:
            duplicate, seq = ingest(self.scheduler, agent_id, request.job_id, request.lease_id, request.run)
        except InvalidRun as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"run {request.run.run_id}: {e}")
        except SchedulerError as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        (self.metrics.runs_duplicate if duplicate else self.metrics.runs_ingested).inc()
        return pb.ReportResultResponse(duplicate=duplicate, ingest_seq=seq)

    def CompleteJob(self, request, context):
        try:
            self.scheduler.complete(auth.current_agent.get(), request.job_id, request.lease_id, request.run_count)
        except SchedulerError as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return pb.CompleteJobResponse()

    def FailJob(self, request, context):
        reason = request.reason[:2000] or "no reason given"
        try:
            retry = self.scheduler.fail(
                auth.current_agent.get(),
                request.job_id,
                request.lease_id,
                ("refused: " if request.refused else "") + reason,
                retry=not request.refused,
            )
        except SchedulerError as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return pb.FailJobResponse(will_retry=retry)


class AdminServicer(pb_grpc.AdminServiceServicer):
    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.store = scheduler.store

    def CreateToken(self, request, context):
        try:
            token, expires_at = auth.create_token(
                self.store, request.ttl_seconds or 3600.0, request.max_uses or 1, request.note
            )
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return pb.CreateTokenResponse(token=token, expires_at_unix_seconds=expires_at)

    def ListAgents(self, request, context):
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

    def SubmitSweep(self, request, context):
        try:
            sweep = parse_sweep(request.yaml)
            sweep_id, jobs = self.scheduler.submit(sweep, request.yaml)
        except SweepError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except NoMatchingAgents as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return pb.SubmitSweepResponse(sweep_id=sweep_id, jobs=jobs)

    def GetSweep(self, request, context):
        statuses = self._statuses(request.sweep_id)
        if not statuses:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown sweep {request.sweep_id}")
        return statuses[0]

    def ListSweeps(self, request, context):
        return pb.ListSweepsResponse(sweeps=self._statuses(None))

    def CancelSweep(self, request, context):
        try:
            cancelled = self.scheduler.cancel(request.sweep_id)
        except SchedulerError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        return pb.CancelSweepResponse(jobs_cancelled=cancelled)

    def SetAgentState(self, request, context):
        try:
            agents.set_state(self.store, request.agent_id, request.state)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return pb.SetAgentStateResponse()

    def Export(self, request, context):
        columns = EXPORT_COLUMNS.get(request.table)
        if columns is None:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown table {request.table!r} (known: {', '.join(EXPORT_COLUMNS)})",
            )
        limit = min(request.limit or MAX_EXPORT_ROWS, MAX_EXPORT_ROWS)
        with self.store.tx() as con:
            table = con.sql(
                # Table and column names come from EXPORT_COLUMNS, never from the request.
                f"SELECT {columns} FROM {request.table} WHERE seq > ? ORDER BY seq LIMIT ?",
                params=[request.after_seq, limit],
            ).to_arrow_table()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
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
                " count(j.job_id) FILTER (WHERE j.state = 'failed'),"
                " (SELECT count(*) FROM runs r WHERE r.sweep_id = s.sweep_id),"
                " list(j.job_id || ': ' || j.reason) FILTER (WHERE j.state = 'failed')"
                f" FROM sweeps s LEFT JOIN jobs j USING (sweep_id) {where}"
                " GROUP BY ALL ORDER BY s.created_at DESC",
                args,
            ).fetchall()
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
                runs=r[9],
                failures=r[10] or [],
            )
            for r in rows
        ]
