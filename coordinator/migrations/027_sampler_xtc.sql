-- The sampler's XTC probability (specfleet/settings.py sampler_xtc_probability, record schema 8): a
-- checked key, 0 where the sweep set none. Runs stored before did not record it: NULL (unknown).
ALTER TABLE runs ADD COLUMN sampler_xtc_probability DOUBLE;
