"""An engine the agent cannot load is named with the reason, at enrolment and in `agent doctor`,
never simply missing from the engines it enrols with (issue 40: on the H200 llama-cpp-python's
package was carried without its dist-info, and the agent enrolled without llama.cpp, silently)."""

import pytest

from agent import doctor
from agent.doctor import FAIL, OK
from agent.fingerprint import IN_PROCESS_ENGINES, available_engines, engine_problems, engine_versions

pytestmark = [pytest.mark.process]  # the imports are tried in child processes


def test_an_engine_that_does_not_import_or_has_no_metadata_is_named_with_why():
    engines = {
        "fine": (("json",), ("numpy",)),
        "broken": (("no_such_module_i40",), ("numpy",)),
        "partial": (("json", "no_such_module_i41"), ("numpy",)),
        "copied": (("json",), ("no-such-distribution-i40",)),
    }
    problems = engine_problems(engines)
    assert set(problems) == {"broken", "partial", "copied"}
    assert (
        problems["broken"]
        == "no_such_module_i40 does not import: ModuleNotFoundError: No module named 'no_such_module_i40'"
    )
    assert problems["partial"] == "no_such_module_i41 is not installed (no module of that name)"
    assert problems["copied"] == "no installed metadata (dist-info) for no-such-distribution-i40"


def test_this_machine_runs_both_in_process_engines_and_enrols_without_a_broken_one():
    assert engine_problems() == {}
    assert available_engines(problems={})[:2] == list(IN_PROCESS_ENGINES)
    assert "llama.cpp" not in available_engines(problems={"llama.cpp": "llama_cpp does not import: OSError: ..."})


def test_doctor_fails_an_engine_whose_distribution_has_no_metadata():
    versions = engine_versions()
    checks = {c.name: c for c in doctor.check_engines(versions)}
    assert checks["engine llama.cpp"].verdict == OK
    copied = {k: v for k, v in versions.items() if k != "llama-cpp-python"}
    failed = {c.name: c for c in doctor.check_engines(copied)}["engine llama.cpp"]
    assert failed.verdict == FAIL and "llama-cpp-python has no installed metadata" in failed.detail
