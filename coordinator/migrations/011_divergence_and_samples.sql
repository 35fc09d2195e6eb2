-- What a run's output shows beyond its hash (specfleet/record.py, record schema 4): where a
-- greedy check first diverged from its reference, the two tokens there, the target's top-two logit
-- margin and the near-tie threshold it was judged by (divergence: none | near-tie | defect; a
-- near-tie keeps lossless NULL and the pair in the figures), the warning of an arm whose drafter
-- cannot draft within max_new_tokens, and the first 512 characters of the decoded output. Runs
-- stored before recorded none of them: NULL (unknown).
ALTER TABLE runs ADD COLUMN divergence VARCHAR;
ALTER TABLE runs ADD COLUMN divergence_position BIGINT;
ALTER TABLE runs ADD COLUMN divergence_token BIGINT;
ALTER TABLE runs ADD COLUMN divergence_reference_token BIGINT;
ALTER TABLE runs ADD COLUMN divergence_margin DOUBLE;
ALTER TABLE runs ADD COLUMN divergence_threshold DOUBLE;
ALTER TABLE runs ADD COLUMN drafter_warning VARCHAR;
ALTER TABLE runs ADD COLUMN text_sample VARCHAR;
