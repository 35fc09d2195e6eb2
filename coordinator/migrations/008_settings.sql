-- Every declared setting (specfleet/settings.py) that the run record carries in its `settings`
-- part, one column each, and the record schema 3 they came with: the n-gram drafters' parameters
-- (in-process), the llama.cpp thread count used, and a server's command line as recorded flags.
-- Runs stored before recorded none of them: NULL (unknown), never pooled with runs that did.
ALTER TABLE runs ADD COLUMN ngram_n_min BIGINT;
ALTER TABLE runs ADD COLUMN ngram_n_max BIGINT;
ALTER TABLE runs ADD COLUMN ngram_mod_n_match BIGINT;
ALTER TABLE runs ADD COLUMN ngram_mod_n_min BIGINT;
ALTER TABLE runs ADD COLUMN ngram_map_size_n BIGINT;
ALTER TABLE runs ADD COLUMN ngram_map_min_hits BIGINT;
ALTER TABLE runs ADD COLUMN threads BIGINT;
ALTER TABLE runs ADD COLUMN server_flags VARCHAR;
