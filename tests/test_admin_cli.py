"""The admin CLI as a user runs it: `specfleet token|agents|sweep ...` against a coordinator
process on loopback, including every error path a user meets."""

import grpc
import pytest
import yaml

from tests.support.admin_cli import admin, enrol_agents, failed
from tests.support.fleet import SWEEP_YAML
from tests.support.processes import cli

pytestmark = [pytest.mark.process]


def test_token_create_and_its_errors(coord, tmp_path):
    made = admin(coord, "token", "create", "--ttl", "120", "--max-uses", "3", "--note", "lab")
    assert made.stdout.startswith("sft.") and "3 use(s)" in made.stderr
    assert failed(admin(coord, "token", "create", "--ttl", "-5", check=False), "--ttl: must be above 0")
    assert failed(admin(coord, "token", "create", "--max-uses", "0", check=False), "--max-uses: must be above 0")
    assert failed(admin(coord, "token", "create", "--ttl", "soon", check=False), "--ttl: 'soon' is not a number")
    wrong = cli("token", "create", "--coordinator", coord[0], "--admin-token", "sfadm.wrong", check=False)
    assert failed(wrong, "PERMISSION_DENIED", "not an admin credential")
    nowhere = cli("token", "create", "--coordinator", coord[0], "--data-dir", str(tmp_path), check=False)
    assert failed(nowhere, "no admin credential")


def test_agents_list_revoke_drain(coord):
    (revoked_id, revoked), (drained_id, drained) = enrol_agents(coord, "cli-revoke", "cli-drain")
    listing = admin(coord, "agents", "list").stdout
    assert "cli-revoke" in listing and "cli-drain" in listing and "Test CPU" in listing

    assert not revoked.heartbeat().drain  # its heartbeat stream is open when it is revoked
    assert admin(coord, "agents", "revoke", revoked_id).stdout.strip() == f"agent {revoked_id}: revoked"
    with pytest.raises(grpc.RpcError) as e:  # the open stream's next message is refused
        revoked.heartbeat()
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED

    assert not drained.heartbeat().drain
    admin(coord, "agents", "drain", drained_id)
    assert drained.heartbeat().drain
    rows = {line.split()[0]: line.split()[1] for line in admin(coord, "agents", "list").stdout.splitlines()[1:]}
    assert rows["cli-revoke"] == "revoked" and rows["cli-drain"] == "draining"
    assert failed(admin(coord, "agents", "drain", "ag-nosuchagent", check=False), "unknown agent ag-nosuchagent")


def test_sweep_submit_status_list_cancel(coord, tmp_path):
    enrol_agents(coord, "cli-sweeper")
    good = tmp_path / "good.yaml"
    good.write_text(SWEEP_YAML + "target: {agents: [cli-sweeper]}\n")
    out = admin(coord, "sweep", "submit", str(good)).stdout
    sweep_id = out.split()[1].rstrip(":")
    assert sweep_id.startswith("sw-") and "1 job(s) queued" in out

    status = admin(coord, "sweep", "status", sweep_id).stdout
    assert status.split()[:3] == [sweep_id, "test-sweep", "running"] and "0/1 jobs finished" in status
    assert sweep_id in admin(coord, "sweep", "list").stdout
    assert admin(coord, "sweep", "cancel", sweep_id).stdout.strip() == f"sweep {sweep_id}: cancelled 1 open job(s)"
    assert admin(coord, "sweep", "status", sweep_id).stdout.split()[2] == "cancelled"

    assert failed(admin(coord, "sweep", "status", "sw-unknown", check=False), "NOT_FOUND", "unknown sweep sw-unknown")
    assert failed(admin(coord, "sweep", "cancel", "sw-unknown", check=False), "NOT_FOUND", "unknown sweep sw-unknown")
    nobody = tmp_path / "nobody.yaml"
    nobody.write_text(SWEEP_YAML + "target: {chip_families: [M9]}\n")
    assert failed(admin(coord, "sweep", "submit", str(nobody), check=False), "FAILED_PRECONDITION", "no enrolled agent")
    missing = admin(coord, "sweep", "submit", str(tmp_path / "absent.yaml"), check=False)
    assert failed(missing, "absent.yaml")


def test_a_bad_sweep_file_prints_every_problem_and_stores_nothing(coord, tmp_path):
    before = admin(coord, "sweep", "list").stdout
    doc = yaml.safe_load(SWEEP_YAML)
    doc.update(engines=["mlx", "vllm"], repeats=0, prompt_sets=["poetry"], methods={"draft": [99]})
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    result = admin(coord, "sweep", "submit", str(bad), check=False)
    assert failed(
        result,
        "4 problem(s)",
        "engines: unknown engine 'vllm'",
        "repeats: must be at least 1, got 0",
        "prompt_sets: unknown prompt set 'poetry'",
        "methods.draft[0]: must be at most 64, got 99",
    )
    assert len(result.stderr.strip().splitlines()) == 5  # the summary, then one line per problem
    assert admin(coord, "sweep", "list").stdout == before
