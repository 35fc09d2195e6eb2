"""Test seam: the `specfleet` CLI as a build whose run records are another schema version.

`SPECFLEET_TEST_RECORD_SCHEMA=N python -m tests.support.record_schema_seam coordinator serve ...` runs
this checkout with specfleet/record.py's SCHEMA_VERSION set to N in that process only (set
before any other module reads it): with N below this checkout's, a coordinator that reads
records only up to N, as a coordinator not yet upgraded does. Used by
tests/test_rolling_upgrade.py; nothing outside the tests imports it.
"""

import os
import sys

from specfleet import record

record.SCHEMA_VERSION = int(os.environ["SPECFLEET_TEST_RECORD_SCHEMA"])

from cli.main import main  # noqa: E402  (after the seam, so that every module sees it)

if __name__ == "__main__":
    sys.exit(main())
