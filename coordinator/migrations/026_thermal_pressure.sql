-- macOS thermald's thermal pressure level before and after each run (record schema 7,
-- Environment.thermal_pressure; agent/environment.py): nominal, moderate, heavy, trapping or
-- sleeping. NULL for runs stored before and where it cannot be read (Linux).
ALTER TABLE runs ADD COLUMN env_before_thermal_pressure VARCHAR;
ALTER TABLE runs ADD COLUMN env_after_thermal_pressure VARCHAR;
