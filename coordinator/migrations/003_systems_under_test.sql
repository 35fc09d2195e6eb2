-- Systems under test (specfleet/record.py): which system a run measured (our in-process loops,
-- llama-server, or an OpenAI-compatible server such as MTPLX), the server's version and command
-- line, its own timings beside the client's, whether a stateful drafter started fresh, and how
-- server arms were interleaved. Runs stored before were all our in-process loops.
-- No NOT NULL on an added column: DuckDB 1.5 adds none with a constraint (the DEFAULT fills the rows).
ALTER TABLE runs ADD COLUMN system VARCHAR DEFAULT 'specfleet';
ALTER TABLE runs ADD COLUMN server_version VARCHAR DEFAULT '';
ALTER TABLE runs ADD COLUMN server_command VARCHAR DEFAULT '';
ALTER TABLE runs ADD COLUMN server_decode_tokens_per_second DOUBLE;
ALTER TABLE runs ADD COLUMN server_prefill_seconds DOUBLE;
ALTER TABLE runs ADD COLUMN timings_disagree BOOLEAN;
ALTER TABLE runs ADD COLUMN drafter_warm BOOLEAN;
ALTER TABLE runs ADD COLUMN interleaving VARCHAR DEFAULT '';
