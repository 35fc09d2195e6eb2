-- States of their own (coordinator/states.py). A job its agent refused (FailJob refused=True)
-- was stored as failed, its reason 'attempt N of M: refused: <the agent's reason>': it becomes
-- refused, its reason kept, as the scheduler now stores a refusal. A new agent is 'enrolled'
-- until it is first heard from; agents stored before keep their state.
UPDATE jobs
SET state = 'refused', seq = nextval('ingest_seq')
WHERE state = 'failed' AND regexp_matches(reason, '^attempt [0-9]+ of [0-9]+: refused: ');
