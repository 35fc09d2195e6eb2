-- An accelerator in the fleet (specfleet/record.py): the compute backend a run's engine ran on
-- ('cpu', 'cuda', 'metal'; '' where the engine cannot tell), and the energy its generation drew
-- from the machine's counter (NVML on NVIDIA, RAPL on Linux CPUs, IOReport on macOS), with joules
-- per generated token. Runs stored before recorded neither: backend '' and energy NULL.
-- No NOT NULL on an added column: DuckDB 1.5 adds none with a constraint (the DEFAULT fills the rows).
ALTER TABLE runs ADD COLUMN backend VARCHAR DEFAULT '';
ALTER TABLE runs ADD COLUMN energy_source VARCHAR DEFAULT '';
ALTER TABLE runs ADD COLUMN energy_joules DOUBLE;
ALTER TABLE runs ADD COLUMN joules_per_token DOUBLE;
