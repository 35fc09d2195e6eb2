-- Issue 31 (clocks): the coordinator's own time beside the agent's. received_at is when the
-- coordinator received the run (its clock, unix seconds); clock_flag says why the run's agent
-- times cannot be right (it finished after the coordinator received it, or started before its
-- sweep existed, by more than coordinator/ingest.py CLOCK_BOUND_SECONDS); NULL when they can be.
-- Runs stored before: received_at NULL (unknown; ingested_at is the nearest), never flagged.
ALTER TABLE runs ADD COLUMN received_at DOUBLE;
ALTER TABLE runs ADD COLUMN clock_flag VARCHAR;
