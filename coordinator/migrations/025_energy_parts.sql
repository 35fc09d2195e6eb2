-- IOReport's split of a Mac run's energy (specfleet/record.py, record schema 7): the CPU, GPU,
-- Neural Engine and DRAM joules that energy_joules sums (agent/energy.py). NULL for runs stored
-- before, for NVML and RAPL runs, and for a part the chip does not report.
ALTER TABLE runs ADD COLUMN energy_cpu_joules DOUBLE;
ALTER TABLE runs ADD COLUMN energy_gpu_joules DOUBLE;
ALTER TABLE runs ADD COLUMN energy_ane_joules DOUBLE;
ALTER TABLE runs ADD COLUMN energy_dram_joules DOUBLE;
