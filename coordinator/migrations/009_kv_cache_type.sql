-- The KV-cache type the llama.cpp engines ran with (specfleet/settings.py kv_cache_type: -ctk/-ctv,
-- type_k/type_v), record schema 4. Runs stored before did not record it: NULL (unknown).
ALTER TABLE runs ADD COLUMN kv_cache_type VARCHAR;
