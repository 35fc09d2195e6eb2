-- The sampler's min-p truncation (specfleet/settings.py sampler_min_p, record schema 6): a checked
-- key, 0 where the sweep set none. Runs stored before did not record it: NULL (unknown).
ALTER TABLE runs ADD COLUMN sampler_min_p DOUBLE;
