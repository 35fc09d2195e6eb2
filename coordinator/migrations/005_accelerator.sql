-- An accelerator in the fleet (specfleet/record.py): the compute backend a run's engine ran on
-- ('cpu', 'cuda', 'metal'; '' where the engine cannot tell), and the energy its generation drew
-- from the machine's counter (NVML on NVIDIA, RAPL on Linux CPUs, IOReport on macOS), with joules
-- per generated token. Runs stored before recorded neither: backend '' and energy NULL.
ALTER TABLE runs ADD COLUMN backend VARCHAR NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN energy_source VARCHAR NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN energy_joules DOUBLE;
ALTER TABLE runs ADD COLUMN joules_per_token DOUBLE;
