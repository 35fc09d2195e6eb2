-- One row per attempt of a job (rq's Execution): the lease it ran under, its agent, when it
-- started, when it was last extended, when it ended, how (done, failed, refused, held,
-- cancelled, expired, abandoned) and why. A lease that lapsed ('expired') while no other attempt
-- of its job began is re-claimed by its agent's next beat, report or job end
-- (coordinator/scheduler.py reclaim): `reclaims` counts how often. Jobs leased when this
-- migration runs get their open attempt; earlier attempts were never recorded.
CREATE TABLE attempts (
    lease_id        VARCHAR PRIMARY KEY,
    job_id          VARCHAR NOT NULL,
    attempt         INTEGER NOT NULL,
    agent_id        VARCHAR NOT NULL,
    started_at      DOUBLE NOT NULL,
    last_beat_at    DOUBLE,
    ended_at        DOUBLE,
    outcome         VARCHAR,               -- NULL while it runs
    reason          VARCHAR NOT NULL DEFAULT '',
    reclaims        INTEGER NOT NULL DEFAULT 0,
    runs_reported   INTEGER,               -- the run count its agent completed it with
    runs_held       INTEGER NOT NULL DEFAULT 0,  -- of those, held in the agent's spool ('held')
    seq             BIGINT NOT NULL
);
INSERT INTO attempts (lease_id, job_id, attempt, agent_id, started_at, seq)
SELECT lease_id, job_id, attempt, agent_id, updated_at, nextval('ingest_seq') FROM jobs WHERE state = 'leased';
