-- Issue 37 (no measured request is primed): drafter_start, what a run's drafter had seen before it
-- (specfleet/settings.py, record schema 6): "unseen" when it never saw the measured request (a
-- drafter made fresh per generation, or a server started for the run and warmed up on other text).
-- A checked key. Runs stored before recorded none: NULL (unknown), never pooled with runs that did:
-- their stateful drafters (llama-server's ngram-mod) were warmed up on the very request measured.
ALTER TABLE runs ADD COLUMN drafter_start VARCHAR;
