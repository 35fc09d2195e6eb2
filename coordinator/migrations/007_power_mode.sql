-- The energy mode each run started in (specfleet/record.py RunRecord.power_mode): "automatic",
-- "low" or "high" on macOS, the ACPI platform profile on Linux, NULL where it could not be read.
-- A checked key: runs stored before did not read it, so they are NULL (unknown), never pooled
-- with runs that did.
ALTER TABLE runs ADD COLUMN power_mode VARCHAR;
