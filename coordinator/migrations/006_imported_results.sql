-- Results measured by other tools (llama-bench, `mtplx bench run`, `mtplx tune`) and imported
-- with `specfleet import`. A table of their own, never `runs`: no speedup, verdict or metric
-- reads this table, so an imported figure can be shown beside the fleet's (marked imported and
-- unpaired) but never pooled with them. `import_id` is the SHA-256 of the tool and the row as
-- its file gives it: importing the same file, or the same row, again stores nothing twice.
-- Provenance: the tool and its version, the file (name, SHA-256, line), the machine as the file
-- describes it and the importer's note on it, the admin identity that imported it (as the
-- coordinator knows it) and the local user name the CLI sent.
CREATE TABLE imported_results (
    import_id       VARCHAR PRIMARY KEY,
    tool            VARCHAR NOT NULL,
    tool_version    VARCHAR NOT NULL,
    source_file     VARCHAR NOT NULL,
    source_sha256   VARCHAR NOT NULL,
    source_line     INTEGER NOT NULL,
    machine         VARCHAR NOT NULL,
    machine_note    VARCHAR NOT NULL,
    model           VARCHAR NOT NULL,
    test            VARCHAR NOT NULL,
    method          VARCHAR NOT NULL,
    draft_depth     INTEGER NOT NULL,
    n_prompt        INTEGER NOT NULL,
    n_gen           INTEGER NOT NULL,
    n_depth         INTEGER NOT NULL,
    tokens_per_second DOUBLE NOT NULL,
    tokens_per_second_stddev DOUBLE,       -- NULL: the file gives no spread
    samples_tokens_per_second DOUBLE[] NOT NULL,
    acceptance_by_depth DOUBLE[] NOT NULL,
    quality_gates   JSON,                   -- NULL: the file gives none
    measured_at     VARCHAR NOT NULL,
    fields          JSON NOT NULL,
    imported_by     VARCHAR NOT NULL,
    imported_by_user VARCHAR NOT NULL,
    imported_at     DOUBLE NOT NULL,
    seq             BIGINT NOT NULL UNIQUE
);
