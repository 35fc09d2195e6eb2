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


def _admin_token(args) -> str:
    from coordinator.server import admin_credential

    token = args.admin_token or admin_credential(Path(args.data_dir))
    if not token:
        sys.exit(
            f"error: no admin credential: pass --admin-token, set SPECFLEET_ADMIN_TOKEN, or point --data-dir "
            f"at the coordinator's data directory (looked in {args.data_dir})"
        )
    return token


def _admin(args):
    from agent.api import AdminApi, channel

    return AdminApi(channel(args.coordinator, **_tls_files(args)), _admin_token(args))


def _tls_files(args) -> dict[str, Path | None]:
    """The ca/cert/key arguments of agent.api.channel from --tls-ca/--tls-cert/--tls-key."""
    if bool(args.tls_cert) != bool(args.tls_key) or (args.tls_cert and not args.tls_ca):
        sys.exit("error: --tls-cert and --tls-key go together, and need --tls-ca")
    return {k: Path(v) if v else None for k, v in (("ca", args.tls_ca), ("cert", args.tls_cert), ("key", args.tls_key))}


def _add_tls_client_flags(p):
    p.add_argument("--tls-ca", default=_env("TLS_CA"), help="CA that signed the coordinator's certificate")
    # CLIENT_ in the variable names: SPECFLEET_TLS_CERT/KEY are the coordinator's own certificate.
    p.add_argument(
        "--tls-cert", default=_env("CLIENT_TLS_CERT"), help="client certificate, for a coordinator with mTLS"
    )
    p.add_argument("--tls-key", default=_env("CLIENT_TLS_KEY"), help="the client certificate's key")


def _add_agent_run_flags(p):
    p.add_argument(
        "--model-dir",
        action="append",
        default=[],
        help="directory whose models jobs may use (repeatable; SPECFLEET_MODEL_DIRS=DIR:DIR; default: those "
        "given at enrolment; none at all lets jobs name any path)",
    )
    p.add_argument(
        "--metrics-port", type=int, default=int(_env("AGENT_METRICS_PORT")) if _env("AGENT_METRICS_PORT") else None
    )
    p.add_argument(
        "--allow-battery",
        action="store_true",
        default=bool(_env("ALLOW_BATTERY")),
        help="start jobs on battery or in low-power mode too (runs are still flagged)",
    )
    p.add_argument(
        "--llama-server",
        metavar="PATH",
        help="the llama-server binary for llama-server jobs (SPECFLEET_LLAMA_SERVER; default: settings.json's "
        "llama_server, else llama-server on PATH, else this checkout's .data/llama.cpp build)",
    )


def _add_admin_flags(p):
    p.add_argument("--coordinator", default=_env("COORDINATOR", DEFAULT_COORDINATOR), help="HOST:PORT")
    p.add_argument("--admin-token", default=_env("ADMIN_TOKEN"))
    p.add_argument("--data-dir", default=str(default_data_dir()), help="where to find admin.token")
    _add_tls_client_flags(p)


# ---------------------------------------------------------------- coordinator


def cmd_coordinator_serve(args) -> int:
    from coordinator.server import Coordinator, CoordinatorConfig, quiet_gc

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
    quiet_gc()
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
    from coordinator.sweeps import SweepError, parse_sweep
    from protos.specfleet.v1 import fleet_pb2 as pb

    text = Path(args.file).read_text()
    try:
        parse_sweep(text)  # the coordinator validates too; this names every problem on its own line
    except SweepError as e:
        print(
            f"error: {args.file} is not a valid sweep ({len(e.problems)} problem(s)); nothing was submitted:",
            file=sys.stderr,
        )
        for problem in e.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    resp = _admin(args).SubmitSweep(pb.SubmitSweepRequest(yaml=text))
    print(f"sweep {resp.sweep_id}: {resp.jobs} job(s) queued")
    for note in resp.notes:
        print(f"  note: {note}")
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
    client = api.AgentApi(api.channel(args.coordinator, **_tls_files(args)))
    resp = retry.call(lambda: client.enrol(args.token, name, fp, labels, available_engines()), retry.ENROL, "enrol")
    path = AgentIdentity(
        coordinator=args.coordinator,
        agent_id=resp.agent_id,
        name=name,
        credential=resp.credential,
        heartbeat_interval_seconds=resp.heartbeat_interval_seconds,
        tls_ca=str(Path(args.tls_ca).resolve()) if args.tls_ca else None,
        tls_cert=str(Path(args.tls_cert).resolve()) if args.tls_cert else None,
        tls_key=str(Path(args.tls_key).resolve()) if args.tls_key else None,
    ).save(Path(args.config_dir))
    if args.model_dir:
        from agent import settings

        dirs = settings.model_dirs(args.model_dir, Path(args.config_dir))
        settings.save(Path(args.config_dir), model_dirs=[str(d) for d in dirs])
    print(f"enrolled {name} as {resp.agent_id} ({fp.chip}); credential stored in {path}")
    return 0


def cmd_agent_run(args) -> int:
    from agent import settings
    from agent.daemon import Agent

    config_dir = Path(args.config_dir)
    agent = Agent(
        config_dir,
        model_dirs=settings.model_dirs(args.model_dir, config_dir),
        allow_battery=args.allow_battery,
        metrics_port=args.metrics_port,
        allow_downloads=args.allow_downloads,
        llama_server=settings.llama_server(args.llama_server, config_dir),
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: agent.stop.set())
    return agent.run()


def cmd_agent_install_service(args) -> int:
    from agent import service, settings

    config_dir = Path(args.config_dir).resolve()
    run_args = [a for d in settings.model_dirs(args.model_dir, config_dir) for a in ("--model-dir", str(d))]
    if args.metrics_port is not None:
        run_args += ["--metrics-port", str(args.metrics_port)]
    if args.allow_battery:
        run_args.append("--allow-battery")
    if binary := settings.llama_server(args.llama_server, config_dir):
        run_args += ["--llama-server", str(binary)]
    result = service.install(
        config_dir, run_args, dest_dir=Path(args.dest_dir) if args.dest_dir else None, load=not args.no_load
    )
    print(result.message, file=sys.stdout if result.loaded or args.no_load else sys.stderr)
    return 0 if result.loaded or args.no_load else 1


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
    if status.get("not_starting_jobs"):
        print(f"  not starting jobs: {status['not_starting_jobs']}")
    if "model_dirs" in status:
        print(f"  model directories: {', '.join(status['model_dirs']) or 'any (none configured: see --model-dir)'}")
    if status.get("last_upload_unix_seconds"):
        print(f"  last upload: {time.time() - status['last_upload_unix_seconds']:.0f}s ago")
    if status.get("metrics_port"):
        print(f"  metrics: http://127.0.0.1:{status['metrics_port']}/metrics")
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

    return serve(args.coordinator, _admin_token(args), args.port, args.host)


def cmd_models_make_tiny(args) -> int:
    from specfleet.tinymodels import make_tiny

    models = make_tiny(Path(args.dir))
    for field, path in models.paths().items():
        print(f"{field:21} {path}")
    return 0


def cmd_demo(args) -> int:
    from specfleet.demo import run_demo

    return run_demo(Path(args.data_dir), dashboard=not args.no_dashboard, dashboard_port=args.dashboard_port)


# ---------------------------------------------------------------- parser


def _positive(kind):
    """An argparse type: a number above zero (0 would mean "the server's default" on the wire)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return parse


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
    p.add_argument("--ttl", type=_positive(float), default=3600.0, help="seconds until it expires")
    p.add_argument("--max-uses", type=_positive(int), default=1)
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
    _add_tls_client_flags(p)
    p.add_argument("--config-dir", default=str(default_config_dir()))
    p.add_argument("--model-dir", action="append", default=[], help="directory whose models jobs may use (repeatable)")
    p.set_defaults(fn=cmd_agent_enrol)
    p = ag.add_parser("run", help="take jobs until stopped")
    p.add_argument("--config-dir", default=str(default_config_dir()))
    _add_agent_run_flags(p)
    p.add_argument(
        "--allow-downloads",
        action="store_true",
        default=bool(_env("ALLOW_DOWNLOADS")),
        help="let jobs download Hugging Face models missing from the cache (default: cache only)",
    )
    p.set_defaults(fn=cmd_agent_run)
    p = ag.add_parser("install-service", help="run the agent at login: launchd on macOS, systemd --user on Linux")
    p.add_argument("--config-dir", default=str(default_config_dir()))
    _add_agent_run_flags(p)
    p.add_argument("--no-load", action="store_true", help="write the service file only")
    p.add_argument("--dest-dir", help="where to write it (default: ~/Library/LaunchAgents or ~/.config/systemd/user)")
    p.set_defaults(fn=cmd_agent_install_service)
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
