"""Helpers shared by the tests: an in-process coordinator, clients and run records."""

from __future__ import annotations

import uuid

from agent.api import AdminApi, AgentApi, channel
from coordinator.server import Coordinator, CoordinatorConfig, admin_credential
from protos.specfleet.v1 import fleet_pb2 as pb

LINUX_BOX = pb.Fingerprint(hostname="box", os="linux", chip="Test CPU", memory_bytes=16 * 2**30, cpu_cores=2)


def start_coordinator(data_dir, **config) -> Coordinator:
    return Coordinator(CoordinatorConfig(data_dir=data_dir, port=0, metrics_port=0, **config)).start()


def admin_for(coordinator: Coordinator) -> AdminApi:
    return AdminApi(channel(f"127.0.0.1:{coordinator.port}"), admin_credential(coordinator.config.data_dir))


def enrol(
    coordinator: Coordinator, name: str = "mac-1", fingerprint=LINUX_BOX, engines=("mlx", "llama.cpp"), labels=None
) -> AgentApi:
    admin = admin_for(coordinator)
    token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
    address = f"127.0.0.1:{coordinator.port}"
    resp = AgentApi(channel(address)).enrol(token, name, fingerprint, labels or {}, list(engines))
    api = AgentApi(channel(address), resp.credential)
    api.agent_id = resp.agent_id
    return api


def make_run(job_id: str, method: str = "baseline", depth: int = 0, tps: float = 100.0, **overrides) -> pb.Run:
    fields = dict(
        run_id=str(uuid.uuid4()),
        job_id=job_id,
        engine="mlx",
        method=method,
        depth=depth,
        prompt_id="code-1",
        repeat=0,
        position=0,
        prompt_tokens=20,
        generated_tokens=32,
        prefill_seconds=0.01,
        ttft_seconds=0.01,
        decode_seconds=31 / tps if tps else 0.0,
        wall_seconds=0.01 + (31 / tps if tps else 0.0),
        decode_tokens_per_second=tps,
        prefill_tokens_per_second=2000.0,
        peak_memory_bytes=10**8,
        output_sha256="ab" * 32,
        started_at_unix_seconds=1.7e9,
    )
    fields.update(overrides)
    return pb.Run(**fields)


SWEEP_YAML = """
name: test-sweep
models:
  mlx: {target: /models/target, draft: /models/draft}
  llama.cpp: {target: /models/target.gguf}
engines: [mlx]
prompt_sets: [code]
methods: {draft: [2]}
max_new_tokens: 16
repeats: 1
max_attempts: 2
"""
