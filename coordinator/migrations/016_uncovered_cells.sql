-- The cells of a sweep that no enrolled agent could run when it was submitted, one line per
-- reason ("3 cells: no agent has llama.cpp", coordinator/coverage.py). Sweeps stored before
-- did not record them: an empty list.
ALTER TABLE sweeps ADD COLUMN uncovered VARCHAR[] DEFAULT [];
