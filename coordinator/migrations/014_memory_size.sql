-- The machine's memory in GiB, rounded (specfleet/settings.py memory_gb, record schema 5): a claim
-- condition ("M4 Pro 24 GB", "a 16 GB M4 mini"), not a checked key. Runs stored before did not
-- record it: NULL (unknown).
ALTER TABLE runs ADD COLUMN memory_gb BIGINT;
