"""The admin CLI as a user runs it against a coordinator process (conftest's `coord`: its address
and data directory), and what a failed command must say."""

from __future__ import annotations

import grpc
import pytest

from specfleet.client import AgentApi, channel
from tests.support.fleet import LINUX_BOX
from tests.support.processes import cli


def admin(coord, *args, check=True):
    address, data = coord
    return cli(*args, "--coordinator", address, "--data-dir", str(data), check=check, timeout=60)


def failed(result, *fragments):
    assert result.returncode != 0, result.stdout
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    return True


def enrol_agents(coord, *names):
    token = admin(coord, "token", "create", "--ttl", "60", "--max-uses", str(len(names))).stdout.strip()
    client = AgentApi(channel(coord[0]))
    apis = []
    for name in names:
        resp = client.enrol(token, name, LINUX_BOX, {}, ["mlx"])
        apis.append((resp.agent_id, AgentApi(channel(coord[0]), resp.credential)))
    with pytest.raises(grpc.RpcError) as e:  # max-uses is honoured
        client.enrol(token, "one-too-many", LINUX_BOX, {}, ["mlx"])
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    return apis
