-- Every mutation of a row takes a fresh value from ingest_seq, so readers can mirror any
-- table incrementally: "give me the rows whose seq is above the last one I saw".
CREATE SEQUENCE ingest_seq START 1;

CREATE TABLE tokens (
    token_hash      VARCHAR PRIMARY KEY,
    note            VARCHAR NOT NULL DEFAULT '',
    created_at      DOUBLE NOT NULL,
    expires_at      DOUBLE NOT NULL,
    max_uses        INTEGER NOT NULL,
    uses            INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE admin_credentials (
    credential_hash VARCHAR PRIMARY KEY,
    created_at      DOUBLE NOT NULL
);

CREATE TABLE agents (
    agent_id        VARCHAR PRIMARY KEY,
    name            VARCHAR NOT NULL,
    credential_hash VARCHAR NOT NULL,
    fingerprint     JSON NOT NULL,
    labels          JSON NOT NULL,
    engines         JSON NOT NULL,
    chip            VARCHAR NOT NULL,
    memory_bytes    BIGINT NOT NULL,
    state           VARCHAR NOT NULL,      -- idle | busy | draining | revoked
    status          VARCHAR NOT NULL DEFAULT '',
    current_job_id  VARCHAR,
    enrolled_at     DOUBLE NOT NULL,
    last_seen       DOUBLE NOT NULL,
    seq             BIGINT NOT NULL
);

CREATE TABLE sweeps (
    sweep_id        VARCHAR PRIMARY KEY,
    name            VARCHAR NOT NULL,
    yaml            VARCHAR NOT NULL,
    state           VARCHAR NOT NULL,      -- running | done | cancelled
    created_at      DOUBLE NOT NULL,
    seq             BIGINT NOT NULL
);

CREATE TABLE jobs (
    job_id          VARCHAR PRIMARY KEY,
    sweep_id        VARCHAR NOT NULL,
    agent_id        VARCHAR NOT NULL,
    spec            JSON NOT NULL,
    state           VARCHAR NOT NULL,      -- queued | leased | done | failed | cancelled
    attempt         INTEGER NOT NULL DEFAULT 0,
    max_attempts    INTEGER NOT NULL,
    lease_id        VARCHAR,
    lease_expires_at DOUBLE,
    reason          VARCHAR NOT NULL DEFAULT '',
    created_at      DOUBLE NOT NULL,
    updated_at      DOUBLE NOT NULL,
    seq             BIGINT NOT NULL
);

CREATE TABLE runs (
    run_id          VARCHAR PRIMARY KEY,
    job_id          VARCHAR NOT NULL,
    lease_id        VARCHAR NOT NULL,      -- the attempt that measured it
    sweep_id        VARCHAR NOT NULL,
    agent_id        VARCHAR NOT NULL,
    chip            VARCHAR NOT NULL,
    engine          VARCHAR NOT NULL,
    method          VARCHAR NOT NULL,
    depth           INTEGER NOT NULL,
    prompt_id       VARCHAR NOT NULL,
    repeat          INTEGER NOT NULL,
    position        INTEGER NOT NULL,
    prompt_tokens   INTEGER NOT NULL,
    generated_tokens INTEGER NOT NULL,
    prefill_seconds DOUBLE NOT NULL,
    ttft_seconds    DOUBLE NOT NULL,
    decode_seconds  DOUBLE NOT NULL,
    wall_seconds    DOUBLE NOT NULL,
    decode_tokens_per_second  DOUBLE NOT NULL,
    prefill_tokens_per_second DOUBLE NOT NULL,
    peak_memory_bytes BIGINT NOT NULL,
    output_sha256   VARCHAR NOT NULL,
    lossless        BOOLEAN,               -- NULL: no baseline to compare with
    metrics         JSON NOT NULL,
    params          JSON NOT NULL,
    started_at      DOUBLE NOT NULL,
    ingested_at     DOUBLE NOT NULL,
    seq             BIGINT NOT NULL UNIQUE
);
