"""A state change the coordinator refuses says, on the CLI, what to do instead (issue 31,
item 7): an undrain of an agent that is not draining, a drain of a draining one, anything done
to a revoked agent, an agent id that does not exist."""

import pytest

from tests.support.admin_cli import admin, enrol_agents, failed

pytestmark = [pytest.mark.process]


def test_refused_state_changes_say_what_to_do(coord):
    (idle_id, idle), (gone_id, _) = enrol_agents(coord, "refusal-idle", "refusal-gone")
    idle.heartbeat()  # seen: idle
    undrain = admin(coord, "agents", "undrain", idle_id, check=False)
    assert failed(undrain, f"agent {idle_id} is idle", "it takes jobs already", f"specfleet agents drain {idle_id}")
    assert len(undrain.stderr.strip().splitlines()) == 1

    admin(coord, "agents", "drain", idle_id)
    again = admin(coord, "agents", "drain", idle_id, check=False)
    assert failed(again, "is draining", f"specfleet agents undrain {idle_id}")
    admin(coord, "agents", "undrain", idle_id)

    admin(coord, "agents", "revoke", gone_id)
    for verb in ("drain", "undrain", "revoke"):
        refused = admin(coord, "agents", verb, gone_id, check=False)
        assert failed(refused, "is revoked", "stays revoked", "specfleet token create", "specfleet agent enrol")

    unknown = admin(coord, "agents", "undrain", "ag-nosuchagent", check=False)
    assert failed(unknown, "unknown agent ag-nosuchagent", "`specfleet agents list` shows the agents")
