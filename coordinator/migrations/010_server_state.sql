-- The fair protocol for server arms and llama-server's --spec-draft-n-min (specfleet/settings.py,
-- record schema 4): server_state (warm | fresh, a checked key: a pair's baseline and arm share it),
-- server_requests (requests the run's server had served before it, warm-up included),
-- warmup_converged (false: the warm-up reached its cap unsteady) and spec_draft_n_min (a checked
-- key). Runs stored before recorded none of them: NULL (unknown), never pooled with runs that did.
ALTER TABLE runs ADD COLUMN server_state VARCHAR;
ALTER TABLE runs ADD COLUMN server_requests BIGINT;
ALTER TABLE runs ADD COLUMN warmup_converged BOOLEAN;
ALTER TABLE runs ADD COLUMN spec_draft_n_min BIGINT;
