-- Why a greedy divergence's logit margin is unknown (specfleet/record.py divergence_cause,
-- record schema 9; agent/divergence.py): the engine's refusal, so that a defect without a margin
-- says why. '' where the margin was measured; NULL where none was asked for, and for runs stored
-- before.
ALTER TABLE runs ADD COLUMN divergence_cause VARCHAR;
