-- Issue 37: a machine is its hardware, never its enrolment. The fleet's salt (made once, at the
-- first enrolment after this migration: coordinator/agents.py fleet_salt) keys the hash of each
-- agent's hardware digest (agent/fingerprint.py), so two fleets cannot join their machines and
-- no raw hardware id is stored. agents.machine_id is that salted hash ("hw-" + 16 hex digits);
-- an agent that reported no hardware id is its own machine (machine_id = agent_id), as every
-- agent enrolled before this migration is. runs.machine_id is the machine of the run's agent,
-- stamped at ingest: what claims, variance components and /metrics count as machines.
CREATE TABLE fleet_salt (salt VARCHAR NOT NULL);
ALTER TABLE agents ADD COLUMN machine_id VARCHAR;
UPDATE agents SET machine_id = agent_id;
ALTER TABLE runs ADD COLUMN machine_id VARCHAR;
UPDATE runs SET machine_id = agent_id;
