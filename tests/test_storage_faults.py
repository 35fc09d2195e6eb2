"""A full disk under the coordinator's data directory: runs are answered UNAVAILABLE (the agent
keeps them pending and retries), never refused for good; heartbeats and reads go on; the log and
/metrics say the store refuses writes; once space returns the same runs are stored and nothing
stored before is lost. A real coordinator process on a real tmpfs (mounted by the test: root only)."""

import contextlib
import errno
import subprocess
import urllib.request

import grpc
import pytest

from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.client import AdminApi, AgentApi, channel
from specfleet.data_dir import admin_credential
from tests.support.fleet import LINUX_BOX, SWEEP_YAML, make_run
from tests.support.processes import start_coordinator, stop, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.process]


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path) -> None:
    """Write `path` until the filesystem is full."""
    with open(path, "wb") as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    with open(path, "ab") as f, pytest.raises(OSError) as full:
        f.write(b"\0" * 65536)
        f.flush()
    assert full.value.errno == errno.ENOSPC


def scrape(endpoints) -> str:
    return urllib.request.urlopen(f"http://{endpoints['metrics']}/metrics", timeout=10).read().decode()


def test_a_full_disk_answers_unavailable_and_loses_nothing(small_disk):
    data = small_disk / "coordinator"
    proc, endpoints = start_coordinator(data)
    try:
        address = endpoints["grpc"]
        admin = AdminApi(channel(address), admin_credential(data))
        token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
        credential = AgentApi(channel(address)).enrol(token, "full", LINUX_BOX, {}, ["mlx"]).credential
        agent = AgentApi(channel(address), credential)
        sweep_id = admin.SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML)).sweep_id
        job = agent.acquire_job(1.0).job
        before = [make_run(job.job_id) for _ in range(5)]
        for record in before:
            agent.report_result(job.job_id, job.lease_id, record)
        assert "specfleet_store_writable 1.0" in scrape(endpoints)

        fill(small_disk / "filler")
        during = [make_run(job.job_id) for _ in range(3)]
        for record in during:
            with pytest.raises(grpc.RpcError) as refused:
                agent.report_result(job.job_id, job.lease_id, record)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
            assert "store refuses writes" in refused.value.details()
        # The coordinator goes on serving: heartbeats keep the lease, reads answer, /metrics says why.
        assert agent.heartbeat(job.job_id, job.lease_id).lease_valid
        assert admin.GetSweep(pb.GetSweepRequest(sweep_id=sweep_id)).runs == len(before)
        assert admin.Export(pb.ExportRequest(table="runs")).rows == len(before)
        assert "specfleet_store_writable 0.0" in scrape(endpoints)
        assert "the store refuses writes" in (data / "coordinator.log").read_text()

        (small_disk / "filler").unlink()  # space returns: the same uploads, retried, are stored
        for record in during:
            assert agent.report_result(job.job_id, job.lease_id, record).duplicate is False
        assert "specfleet_store_writable 1.0" in scrape(endpoints)
        wait_until(lambda: "takes writes again" in (data / "coordinator.log").read_text(), "the log to say so", 10)
        assert admin.GetSweep(pb.GetSweepRequest(sweep_id=sweep_id)).runs == len(before) + len(during)
        agent.close()
    finally:
        assert stop(proc) == 0
