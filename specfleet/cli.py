"""`specfleet`: one console script for the coordinator, the agent, admin tasks, the dashboard
and the demo. Every flag can also be set from a SPECFLEET_* environment variable."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

DEFAULT_COORDINATOR = "127.0.0.1:50551"


def _env(name: str, default=None):
    return os.environ.get(f"SPECFLEET_{name}", default)


def default_data_dir() -> Path:
    return Path(_env("DATA_DIR") or Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local/share")) / "specfleet")


def _admin(args):
    from agent.api import AdminApi, channel
    from coordinator.server import admin_credential

    token = args.admin_token or admin_credential(Path(args.data_dir))
    if not token:
        sys.exit(
            f"error: no admin credential: pass --admin-token, set SPECFLEET_ADMIN_TOKEN, or point --data-dir "
            f"at the coordinator's data directory (looked in {args.data_dir})"
        )
    return AdminApi(channel(args.coordinator, ca=Path(args.tls_ca) if args.tls_ca else None), token)


def _add_admin_flags(p):
    p.add_argument("--coordinator", default=_env("COORDINATOR", DEFAULT_COORDINATOR), help="HOST:PORT")
    p.add_argument("--admin-token", default=_env("ADMIN_TOKEN"))
    p.add_argument("--data-dir", default=str(default_data_dir()), help="where to find admin.token")
    p.add_argument("--tls-ca", default=_env("TLS_CA"))


# ---------------------------------------------------------------- coordinator


def cmd_coordinator_serve(args) -> int:
    from coordinator.server import Coordinator, CoordinatorConfig

    opt = lambda v: Path(v) if v else None  # noqa: E731
    config = CoordinatorConfig(
        data_dir=Path(args.data_dir),
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        lease_seconds=args.lease_seconds,
        tls_cert=opt(args.tls_cert),
        tls_key=opt(args.tls_key),
        tls_client_ca=opt(args.tls_client_ca),
    )
    coordinator = Coordinator(config).start()
    print(
        f"coordinator: gRPC on {config.host}:{coordinator.port}, metrics on {coordinator.metrics_port}, "
        f"data in {config.data_dir}",
        flush=True,
    )
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    coordinator.stop()
    return 0


def cmd_token_create(args) -> int:
    from protos.specfleet.v1 import fleet_pb2 as pb

    resp = _admin(args).CreateToken(pb.CreateTokenRequest(ttl_seconds=args.ttl, max_uses=args.max_uses, note=args.note))
    print(resp.token)
    print(
        f"expires {time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(resp.expires_at_unix_seconds))}, "
        f"{args.max_uses} use(s)",
        file=sys.stderr,
    )
    return 0


def cmd_agents_list(args) -> int:
    from protos.specfleet.v1 import fleet_pb2 as pb

    agents = _admin(args).ListAgents(pb.ListAgentsRequest()).agents
    print(f"{'NAME':20} {'STATE':9} {'CHIP':34} {'MEMORY':>8}  LAST SEEN  STATUS")
    for a in agents:
        ago = time.time() - a.last_seen_unix_seconds
        print(
            f"{a.name:20} {a.state:9} {a.fingerprint.chip[:34]:34} {a.fingerprint.memory_bytes / 2**30:7.1f}G"
            f"  {ago:7.0f}s  {a.status}"
        )
    return 0


def cmd_agents_set_state(args) -> int:
    from protos.specfleet.v1 import fleet_pb2 as pb

    _admin(args).SetAgentState(pb.SetAgentStateRequest(agent_id=args.agent_id, state=args.state))
    print(f"agent {args.agent_id}: {args.state}")
    return 0


# ---------------------------------------------------------------- sweeps


def cmd_sweep_submit(args) -> int:
    from protos.specfleet.v1 import fleet_pb2 as pb

    text = Path(args.file).read_text()
    resp = _admin(args).SubmitSweep(pb.SubmitSweepRequest(yaml=text))
    print(f"sweep {resp.sweep_id}: {resp.jobs} job(s) queued")
    return 0


def print_sweep(s) -> None:
    finished = s.jobs_done + s.jobs_failed
    print(
        f"{s.sweep_id}  {s.name:24} {s.state:9} {finished}/{s.jobs_total} jobs finished "
        f"(queued {s.jobs_queued}, running {s.jobs_running}, done {s.jobs_done}, failed {s.jobs_failed}), "
        f"{s.runs} runs"
    )
    for failure in s.failures:
        print(f"    failed {failure}")


def cmd_sweep_status(args) -> int:
    from protos.specfleet.v1 import fleet_pb2 as pb

    admin = _admin(args)
    sweeps = (
        [admin.GetSweep(pb.GetSweepRequest(sweep_id=args.sweep_id))]
        if args.sweep_id
        else admin.ListSweeps(pb.ListSweepsRequest()).sweeps
    )
    for s in sweeps:
        print_sweep(s)
    return 0


def cmd_sweep_cancel(args) -> int:
    from protos.specfleet.v1 import fleet_pb2 as pb

    resp = _admin(args).CancelSweep(pb.CancelSweepRequest(sweep_id=args.sweep_id))
    print(f"sweep {args.sweep_id}: cancelled {resp.jobs_cancelled} open job(s)")
    return 0


# ---------------------------------------------------------------- agent


def cmd_agent_enrol(args) -> int:
    from agent import api, retry
    from agent.credentials import AgentIdentity
    from agent.fingerprint import available_engines, fingerprint

    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            sys.exit(f"error: --label {item!r} must look like key=value")
        labels[key] = value
    fp = fingerprint()
    name = args.name or fp.hostname.split(".")[0]
    client = api.AgentApi(api.channel(args.coordinator, ca=Path(args.tls_ca) if args.tls_ca else None))
    resp = retry.call(lambda: client.enrol(args.token, name, fp, labels, available_engines()), retry.ENROL, "enrol")
    path = AgentIdentity(
        coordinator=args.coordinator,
        agent_id=resp.agent_id,
        name=name,
        credential=resp.credential,
        heartbeat_interval_seconds=resp.heartbeat_interval_seconds,
        tls_ca=args.tls_ca,
    ).save(Path(args.config_dir))
    print(f"enrolled {name} as {resp.agent_id} ({fp.chip}); credential stored in {path}")
    return 0


def cmd_agent_run(args) -> int:
    from agent.daemon import Agent

    agent = Agent(Path(args.config_dir))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: agent.stop.set())
    return agent.run()


def cmd_agent_status(args) -> int:
    path = Path(args.config_dir) / "status.json"
    if not path.exists():
        sys.exit(f"error: no agent status at {path}: is `specfleet agent run` running with this --config-dir?")
    status = json.loads(path.read_text())
    ago = time.time() - status["last_contact_unix_seconds"] if status["last_contact_unix_seconds"] else None
    print(f"agent {status['agent']}: {status['status']}")
    print(f"  current job: {status['job_id'] or 'none'}")
    print(f"  spool depth: {status['spool_depth']}")
    print(f"  last contact: {f'{ago:.0f}s ago' if ago is not None else 'never'}")
    return 0


# ---------------------------------------------------------------- other


def cmd_export(args) -> int:
    from coordinator.export import export_from_coordinator, export_from_data_dir

    if args.stopped:
        n = export_from_data_dir(Path(args.data_dir), Path(args.output), args.format)
    else:
        n = export_from_coordinator(_admin(args), Path(args.output), args.format)
    print(f"wrote {n} runs to {args.output}")
    return 0


def cmd_dashboard(args) -> int:
    from dashboard.serve import serve

    return serve(args.coordinator, args.admin_token or _admin_token_from(args), args.port, args.host)


def _admin_token_from(args) -> str:
    from coordinator.server import admin_credential

    token = admin_credential(Path(args.data_dir))
    if not token:
        sys.exit("error: the dashboard needs an admin credential: --admin-token or --data-dir")
    return token


def cmd_models_make_tiny(args) -> int:
    from specfleet.tinymodels import make_tiny

    models = make_tiny(Path(args.dir))
    for field in ("mlx_target", "mlx_draft", "gguf_target", "gguf_draft"):
        print(f"{field:12} {getattr(models, field)}")
    return 0


def cmd_demo(args) -> int:
    from specfleet.demo import run_demo

    return run_demo(Path(args.data_dir), dashboard=not args.no_dashboard, dashboard_port=args.dashboard_port)


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specfleet", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    coord = sub.add_parser("coordinator", help="run the coordinator").add_subparsers(dest="sub", required=True)
    p = coord.add_parser("serve", help="serve gRPC and /metrics with a DuckDB file in --data-dir")
    p.add_argument("--data-dir", default=str(default_data_dir()))
    p.add_argument("--host", default=_env("HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(_env("PORT", 50551)))
    p.add_argument("--metrics-port", type=int, default=int(_env("METRICS_PORT", 9464)), help="-1 disables")
    p.add_argument("--lease-seconds", type=float, default=float(_env("LEASE_SECONDS", 60)))
    p.add_argument("--tls-cert", default=_env("TLS_CERT"))
    p.add_argument("--tls-key", default=_env("TLS_KEY"))
    p.add_argument("--tls-client-ca", default=_env("TLS_CLIENT_CA"), help="require client certificates (mTLS)")
    p.set_defaults(fn=cmd_coordinator_serve)

    token = sub.add_parser("token", help="enrolment tokens").add_subparsers(dest="sub", required=True)
    p = token.add_parser("create", help="create an expiring enrolment token")
    p.add_argument("--ttl", type=float, default=3600.0, help="seconds until it expires")
    p.add_argument("--max-uses", type=int, default=1)
    p.add_argument("--note", default="")
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_token_create)

    agents = sub.add_parser("agents", help="the fleet's agents").add_subparsers(dest="sub", required=True)
    p = agents.add_parser("list")
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_agents_list)
    for verb, state in (("revoke", "revoked"), ("drain", "draining")):
        p = agents.add_parser(verb)
        p.add_argument("agent_id")
        _add_admin_flags(p)
        p.set_defaults(fn=cmd_agents_set_state, state=state)

    sweep = sub.add_parser("sweep", help="benchmark sweeps").add_subparsers(dest="sub", required=True)
    p = sweep.add_parser("submit", help="validate a sweep file and queue its jobs")
    p.add_argument("file")
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_sweep_submit)
    p = sweep.add_parser("status", help="progress of one sweep, or of all")
    p.add_argument("sweep_id", nargs="?")
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_sweep_status)
    p = sweep.add_parser("list", help="every sweep with its progress")
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_sweep_status, sweep_id=None)
    p = sweep.add_parser("cancel")
    p.add_argument("sweep_id")
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_sweep_cancel)

    ag = sub.add_parser("agent", help="run this machine as an agent").add_subparsers(dest="sub", required=True)
    from agent.credentials import default_config_dir

    p = ag.add_parser("enrol", help="enrol this machine with a token")
    p.add_argument("--coordinator", required=True, help="HOST:PORT")
    p.add_argument("--token", required=True)
    p.add_argument("--name")
    p.add_argument("--label", action="append", default=[], help="key=value (repeatable)")
    p.add_argument("--tls-ca", default=_env("TLS_CA"))
    p.add_argument("--config-dir", default=str(default_config_dir()))
    p.set_defaults(fn=cmd_agent_enrol)
    p = ag.add_parser("run", help="take jobs until stopped")
    p.add_argument("--config-dir", default=str(default_config_dir()))
    p.set_defaults(fn=cmd_agent_run)
    p = ag.add_parser("status", help="current job, spool depth, last contact")
    p.add_argument("--config-dir", default=str(default_config_dir()))
    p.set_defaults(fn=cmd_agent_status)

    p = sub.add_parser("export", help="one row per run, every parameter and metric")
    p.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    p.add_argument("--output", required=True)
    p.add_argument("--stopped", action="store_true", help="read --data-dir's file directly (coordinator stopped)")
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_export)

    p = sub.add_parser("dashboard", help="serve the Streamlit dashboard")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=int(_env("DASHBOARD_PORT", 8501)))
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_dashboard)

    models = sub.add_parser("models", help="model utilities").add_subparsers(dest="sub", required=True)
    p = models.add_parser("make-tiny", help="build the tiny target and draft (MLX dir + GGUF) offline")
    p.add_argument("dir")
    p.set_defaults(fn=cmd_models_make_tiny)

    p = sub.add_parser("demo", help="the whole fleet on this machine with tiny models")
    p.add_argument("--data-dir", default=_env("DEMO_DIR", ".data/demo"))
    p.add_argument("--no-dashboard", action="store_true", help="exit when the sweep is done")
    p.add_argument("--dashboard-port", type=int, default=int(_env("DASHBOARD_PORT", 8501)))
    p.set_defaults(fn=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("gguf").setLevel(logging.WARNING)
    import grpc

    try:
        return args.fn(args)
    except grpc.RpcError as e:
        print(f"error: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    except (FileNotFoundError, PermissionError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
