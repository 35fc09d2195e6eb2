-- The typed run record (specfleet/record.py, schema 2): one column per leaf field of
-- RunRecord, nested parts as <part>_<field>, beside the coordinator's own columns (lease,
-- sweep, agent, chip, ingest time and sequence, the record's digest). Every run stored
-- before is kept: its params and metrics JSON are read into the typed columns. What schema 1
-- never recorded stays unknown (empty text, 0, NULL), never guessed: model architecture,
-- parameters and quantisation, the prompt set's digest, counts of proposals by position.
CREATE TABLE runs_v2 (
    run_id          VARCHAR PRIMARY KEY,
    job_id          VARCHAR NOT NULL,
    lease_id        VARCHAR NOT NULL,      -- the attempt that measured it
    sweep_id        VARCHAR NOT NULL,
    agent_id        VARCHAR NOT NULL,
    chip            VARCHAR NOT NULL,
    attempt         INTEGER NOT NULL,
    engine          VARCHAR NOT NULL,
    engine_version  VARCHAR NOT NULL,
    method          VARCHAR NOT NULL,
    depth           INTEGER NOT NULL,
    target_reference VARCHAR NOT NULL,
    target_revision VARCHAR NOT NULL,
    target_digest   VARCHAR NOT NULL,
    target_architecture VARCHAR NOT NULL,
    target_parameters BIGINT NOT NULL,
    target_quantisation VARCHAR NOT NULL,
    target_tensor_types VARCHAR NOT NULL,
    target_vocab_size INTEGER NOT NULL,
    target_context_length INTEGER NOT NULL,
    target_has_mtp  BOOLEAN NOT NULL,
    target_bytes    BIGINT NOT NULL,
    target_source   VARCHAR NOT NULL,
    sampler_temperature DOUBLE NOT NULL,
    sampler_top_p   DOUBLE NOT NULL,
    sampler_top_k   INTEGER NOT NULL,
    sampler_seed    BIGINT NOT NULL,
    prompt_set      VARCHAR NOT NULL,
    prompt_set_digest VARCHAR NOT NULL,
    prompt_category VARCHAR NOT NULL,
    prompt_id       VARCHAR NOT NULL,
    context_tokens  INTEGER NOT NULL,
    max_new_tokens  INTEGER NOT NULL,
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
    started_at_unix_seconds DOUBLE NOT NULL,
    draft_reference VARCHAR NOT NULL,
    draft_revision  VARCHAR NOT NULL,
    draft_digest    VARCHAR NOT NULL,
    draft_architecture VARCHAR NOT NULL,
    draft_parameters BIGINT NOT NULL,
    draft_quantisation VARCHAR NOT NULL,
    draft_tensor_types VARCHAR NOT NULL,
    draft_vocab_size INTEGER NOT NULL,
    draft_context_length INTEGER NOT NULL,
    draft_has_mtp   BOOLEAN NOT NULL,
    draft_bytes     BIGINT NOT NULL,
    draft_source    VARCHAR NOT NULL,
    lossless        BOOLEAN,               -- NULL: not checked
    lossless_check  VARCHAR NOT NULL,      -- greedy reference | same-seed baseline | not checkable | ''
    run_seed        BIGINT NOT NULL,       -- the seed the run sampled with
    inter_token_latency_p50_seconds DOUBLE,
    inter_token_latency_p90_seconds DOUBLE,
    inter_token_latency_p99_seconds DOUBLE,
    round_latency_p50_seconds DOUBLE,
    round_latency_p90_seconds DOUBLE,
    rounds          INTEGER NOT NULL,
    tokens_drafted  INTEGER NOT NULL,
    tokens_accepted INTEGER NOT NULL,
    draft_seconds   DOUBLE NOT NULL,
    verify_seconds  DOUBLE NOT NULL,
    drafted_by_position INTEGER[] NOT NULL,
    acceptance_by_position DOUBLE[] NOT NULL,
    acceptance_collapsed BOOLEAN,
    acceptance_reason VARCHAR NOT NULL,
    verify_cost_seconds DOUBLE[] NOT NULL,
    warmup_runs     INTEGER NOT NULL,
    arm_order       VARCHAR NOT NULL,
    load_seconds    DOUBLE NOT NULL,
    cooldown_seconds DOUBLE NOT NULL,
    env_before_thermal VARCHAR,
    env_before_power_source VARCHAR,
    env_before_low_power_mode BOOLEAN,
    env_before_loadavg_1m DOUBLE,
    env_before_memory_available_bytes BIGINT,
    env_before_swap_used_bytes BIGINT,
    env_after_thermal VARCHAR,
    env_after_power_source VARCHAR,
    env_after_low_power_mode BOOLEAN,
    env_after_loadavg_1m DOUBLE,
    env_after_memory_available_bytes BIGINT,
    env_after_swap_used_bytes BIGINT,
    env_nominal     BOOLEAN,               -- NULL: the readings that decide it were unavailable
    env_reasons     VARCHAR[] NOT NULL,
    schema          INTEGER NOT NULL,
    record_sha256   VARCHAR NOT NULL,      -- of the record as uploaded; '' for schema-1 runs
    ingested_at     DOUBLE NOT NULL,
    seq             BIGINT NOT NULL UNIQUE
);

-- A schema-1 reading: 'unavailable' is NULL.
CREATE MACRO _v1_reading(params, key) AS nullif(params->>key, 'unavailable');
-- A schema-1 model reference was what the sweep named, a path or a hub id: keep a hub id,
-- and of a path only its last component.
CREATE MACRO _v1_reference(params, role) AS CASE
    WHEN params->>('model.' || role || '.source') = 'huggingface' THEN params->>('model.' || role || '.reference')
    ELSE regexp_extract(
        rtrim(coalesce(params->>('model.' || role || '.reference'), params->>('model.' || role), ''), '/'),
        '([^/]*)$', 1)
    END;

INSERT INTO runs_v2
SELECT
    run_id, job_id, lease_id, sweep_id, agent_id, chip,
    coalesce(try_cast(params->>'attempt' AS INTEGER), 0),
    engine,
    array_to_string(list_transform(
        list_sort(list_filter(json_keys(params), lambda k: starts_with(k, 'version.'))),
        lambda k: substr(k, 9) || '=' || (params->>k)), ' '),
    method, depth,
    _v1_reference(params, 'target'), '', coalesce(params->>'model.target.sha256', ''), '', 0, '', '', 0, 0, false,
    coalesce(try_cast(params->>'model.target.bytes' AS BIGINT), 0), coalesce(params->>'model.target.source', ''),
    coalesce(try_cast(regexp_extract(params->>'sampler', 'temperature=([^,]+)', 1) AS DOUBLE), 0),
    coalesce(try_cast(regexp_extract(params->>'sampler', 'top_p=([^,]+)', 1) AS DOUBLE), 1),
    coalesce(try_cast(regexp_extract(params->>'sampler', 'top_k=([^,]+)', 1) AS INTEGER), 0),
    coalesce(try_cast(regexp_extract(params->>'sampler', 'seed=([^,]+)', 1) AS BIGINT), 0),
    coalesce(params->>'prompt_set', ''), '',
    CASE WHEN method = 'verify-cost' THEN ''
         ELSE CASE coalesce(params->>'prompt_set', '')
             WHEN 'chat' THEN 'conversation' WHEN 'summarise' THEN 'summarisation'
             ELSE coalesce(params->>'prompt_set', '') END
    END,
    prompt_id,
    CASE WHEN method = 'verify-cost' THEN prompt_tokens ELSE 0 END,
    coalesce(try_cast(params->>'max_new_tokens' AS INTEGER), 0),
    repeat, position, prompt_tokens, generated_tokens,
    prefill_seconds, ttft_seconds, decode_seconds, wall_seconds,
    decode_tokens_per_second, prefill_tokens_per_second, peak_memory_bytes, output_sha256, started_at,
    CASE WHEN coalesce(params->>'model.draft', '') = '' THEN '' ELSE _v1_reference(params, 'draft') END,
    '', coalesce(params->>'model.draft.sha256', ''), '', 0, '', '', 0, 0, false,
    coalesce(try_cast(params->>'model.draft.bytes' AS BIGINT), 0), coalesce(params->>'model.draft.source', ''),
    lossless,
    CASE WHEN lossless IS NOT NULL THEN 'greedy reference' ELSE '' END,  -- schema 1 checked greedy runs only
    coalesce(try_cast(regexp_extract(params->>'sampler', 'seed=([^,]+)', 1) AS BIGINT), 0),  -- one seed for all
    try_cast(metrics->>'inter_token_latency_p50_seconds' AS DOUBLE),
    try_cast(metrics->>'inter_token_latency_p90_seconds' AS DOUBLE),
    try_cast(metrics->>'inter_token_latency_p99_seconds' AS DOUBLE),
    NULL, NULL,
    coalesce(try_cast(metrics->>'rounds' AS DOUBLE), 0)::INTEGER,
    coalesce(try_cast(metrics->>'tokens_drafted' AS DOUBLE), 0)::INTEGER,
    coalesce(try_cast(metrics->>'tokens_accepted' AS DOUBLE), 0)::INTEGER,
    coalesce(try_cast(metrics->>'draft_seconds' AS DOUBLE), 0),
    coalesce(try_cast(metrics->>'verify_seconds' AS DOUBLE), 0),
    []::INTEGER[],
    list_filter(list_transform(range(1, 65),
        lambda i: try_cast(metrics->>('acceptance_at_position_' || i) AS DOUBLE)), lambda x: x IS NOT NULL),
    CASE params->>'acceptance.collapsed' WHEN 'true' THEN true WHEN 'false' THEN false END,
    coalesce(params->>'acceptance.reason', ''),
    list_filter(list_transform(range(1, 65),
        lambda m: try_cast(metrics->>('rows_' || m || '_seconds') AS DOUBLE)), lambda x: x IS NOT NULL),
    coalesce(try_cast(regexp_extract(coalesce(params->>'warmup_runs', ''),
        method || '-' || depth || ':([0-9]+)', 1) AS INTEGER), 0),
    'rotated',
    coalesce(try_cast(params->>'load_seconds' AS DOUBLE), 0),
    coalesce(try_cast(params->>'cooldown_seconds' AS DOUBLE), 0),
    _v1_reading(params, 'env.before.thermal'),
    _v1_reading(params, 'env.before.power_source'),
    CASE _v1_reading(params, 'env.before.low_power_mode') WHEN 'on' THEN true WHEN 'off' THEN false END,
    try_cast(_v1_reading(params, 'env.before.loadavg_1m') AS DOUBLE),
    try_cast(_v1_reading(params, 'env.before.memory_available_bytes') AS BIGINT),
    try_cast(_v1_reading(params, 'env.before.swap_used_bytes') AS BIGINT),
    _v1_reading(params, 'env.after.thermal'),
    _v1_reading(params, 'env.after.power_source'),
    CASE _v1_reading(params, 'env.after.low_power_mode') WHEN 'on' THEN true WHEN 'off' THEN false END,
    try_cast(_v1_reading(params, 'env.after.loadavg_1m') AS DOUBLE),
    try_cast(_v1_reading(params, 'env.after.memory_available_bytes') AS BIGINT),
    try_cast(_v1_reading(params, 'env.after.swap_used_bytes') AS BIGINT),
    -- Schema 1 called a run nominal when nothing was wrong, even with its readings unavailable.
    CASE WHEN params->>'env.nominal' = 'false' THEN false
         WHEN params->>'env.nominal' IS NULL
              OR _v1_reading(params, 'env.before.thermal') IS NULL
              OR _v1_reading(params, 'env.before.power_source') IS NULL THEN NULL
         ELSE true END,
    list_filter(string_split(coalesce(params->>'env.reasons', ''), '; '), lambda x: x != ''),
    2,
    '',
    ingested_at,
    seq
FROM runs;

DROP TABLE runs;
ALTER TABLE runs_v2 RENAME TO runs;
DROP MACRO _v1_reading;
DROP MACRO _v1_reference;
