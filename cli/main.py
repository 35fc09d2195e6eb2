"""`specfleet`: one console script for the coordinator, the agent, admin tasks, the dashboard
and the demo. Every flag can also be set from a SPECFLEET_* environment variable (its --help
names it); a flag given wins. Every error is one line on stderr and a non-zero exit status."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from specfleet.data_dir import DEFAULT_COORDINATOR, default_data_dir

MAX_ERROR_CHARS = 2000
MAX_PRINTED_PROBLEMS = 50  # of a sweep file, one a line
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line: `error: PROG: MESSAGE (see PROG --help)`."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


class _Repeatable(argparse.Action):
    """A repeatable flag whose values replace its default (from the environment), not add to it."""

    def __call__(self, parser, namespace, values, option_string=None):
        current = getattr(namespace, self.dest)
        setattr(namespace, self.dest, [*(() if current is self.default else current), values])


def flag(p: argparse.ArgumentParser, name: str, env: str | None = None, separator: str = ",", **kwargs):
    """Add option `name` whose default comes from SPECFLEET_<env> (by default the flag's name in
    upper case, "-" as "_") when that is set, parsed as the flag would be: with its type and
    choices, "1/true/yes/on" or "0/false/no/off" for a switch, `separator`-separated for a
    repeatable flag. A bad value is a usage error naming the variable."""
    variable = "SPECFLEET_" + (env or name.lstrip("-").upper().replace("-", "_"))
    kwargs["help"] = f"{kwargs.get('help', '')} [{variable}]".lstrip()
    if kwargs.get("action") == "append":
        kwargs.update(action=_Repeatable, default=kwargs.get("default", []))
    text = os.environ.get(variable)
    if text is not None:
        kwargs.update(default=_from_env(p, variable, text, kwargs, separator), required=False)
    action = p.add_argument(name, **kwargs)
    action.env = variable
    return action


def _from_env(p, variable: str, text: str, kwargs: dict, separator: str):
    """The value of an environment variable for a flag added with `kwargs`."""
    if kwargs.get("action") == "store_true":
        if text.strip().lower() not in TRUE_WORDS + FALSE_WORDS:
            p.error(f"{variable}={text!r}: must be one of {', '.join(w for w in TRUE_WORDS + FALSE_WORDS if w)}")
        return text.strip().lower() in TRUE_WORDS
    convert = kwargs.get("type", str)
    try:
        if kwargs.get("action") is _Repeatable:
            value = [convert(v) for v in text.split(separator) if v]
        else:
            value = convert(text)
    except (ValueError, argparse.ArgumentTypeError) as e:
        p.error(f"{variable}={text!r}: {e}")
    if kwargs.get("choices") and value not in kwargs["choices"]:
        p.error(f"{variable}={text!r}: must be one of {', '.join(map(str, kwargs['choices']))}")
    return value


def _admin_token(args) -> str:
    from specfleet.data_dir import admin_credential

    token = args.admin_token or admin_credential(Path(args.data_dir))
    if not token:
        sys.exit(
            f"error: no admin credential: pass --admin-token, set SPECFLEET_ADMIN_TOKEN, or point --data-dir "
            f"at the coordinator's data directory (looked in {args.data_dir})"
        )
    return token


def _coordinator(args) -> str:
    """The coordinator an admin command dials (specfleet/data_dir.py coordinator_address)."""
    from specfleet.data_dir import coordinator_address

    return coordinator_address(args.coordinator, Path(args.data_dir)).address


def _admin(args):
    from specfleet.client import AdminApi, channel

    return AdminApi(channel(_coordinator(args), **_tls_files(args)), _admin_token(args))


def _tls_files(args) -> dict[str, Path | None]:
    """The ca/cert/key arguments of specfleet.client.channel from --tls-ca/--tls-cert/--tls-key."""
    if bool(args.tls_cert) != bool(args.tls_key) or (args.tls_cert and not args.tls_ca):
        sys.exit("error: --tls-cert and --tls-key go together, and need --tls-ca")
    if args.tls_key:
        from specfleet.keys import private_key_file

        private_key_file(Path(args.tls_key))  # made 0600, or refused
    return {k: Path(v) if v else None for k, v in (("ca", args.tls_ca), ("cert", args.tls_cert), ("key", args.tls_key))}


def _add_tls_client_flags(p):
    flag(p, "--tls-ca", help="CA that signed the coordinator's certificate")
    # CLIENT_ in the variable names: SPECFLEET_TLS_CERT/KEY are the coordinator's own certificate.
    flag(p, "--tls-cert", env="CLIENT_TLS_CERT", help="client certificate, for a coordinator with mTLS")
    flag(p, "--tls-key", env="CLIENT_TLS_KEY", help="the client certificate's key")


def _add_job_resource_flags(p):
    """What jobs may use on this machine: `agent run`'s and `agent doctor`'s."""
    flag(
        p,
        "--model-dir",
        env="MODEL_DIRS",
        separator=os.pathsep,
        action="append",
        help=f"directory whose models jobs may use (repeatable; the variable: DIR{os.pathsep}DIR; default: those "
        "given at enrolment; none at all lets jobs name any path)",
    )
    flag(
        p,
        "--llama-server",
        metavar="PATH",
        help="the llama-server binary for llama-server jobs (default: settings.json's llama_server, else "
        "llama-server on PATH, else this checkout's .data/llama.cpp build)",
    )


def _add_agent_run_flags(p):
    _add_job_resource_flags(p)
    flag(p, "--metrics-port", env="AGENT_METRICS_PORT", type=int, help="serve the agent's /metrics on this port")
    flag(
        p,
        "--allow-battery",
        action="store_true",
        help="start jobs on battery or in low-power mode too (runs are still flagged)",
    )
    flag(
        p,
        "--ignore-doctor",
        action="store_true",
        help="start jobs even while a machine check of `agent doctor` fails (another process on the CPU, "
        "thermal, disk); by default such a failure holds jobs until it passes",
    )


def _add_admin_flags(p):
    flag(
        p,
        "--coordinator",
        help=f"HOST:PORT (default: the address in --data-dir's coordinator.json, else {DEFAULT_COORDINATOR})",
    )
    flag(p, "--admin-token")
    flag(p, "--data-dir", default=str(default_data_dir()), help="where to find admin.token and coordinator.json")
    _add_tls_client_flags(p)


# ---------------------------------------------------------------- coordinator


def cmd_coordinator_serve(args) -> int:
    from coordinator.server import Coordinator, CoordinatorConfig, quiet_gc

    if bool(args.tls_cert) != bool(args.tls_key) or (args.tls_client_ca and not args.tls_cert):
        raise ValueError("--tls-cert and --tls-key go together, and --tls-client-ca needs them")
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
        store=args.store,
        name=args.name,
        lake_upkeep_seconds=args.lake_upkeep_seconds,
    )
    coordinator = Coordinator(config).start()
    quiet_gc()
    print(
        f"coordinator: gRPC on {config.host}:{coordinator.port}, metrics on {coordinator.metrics_port}, "
        f"data in {coordinator.store.path}",
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


# What to do when the coordinator refuses an agent's state change (FAILED_PRECONDITION), by the
# state the agent is in (the refusal says "agent ID is STATE..."), else by what was asked.
STATE_CHANGE_HINTS = {
    "revoked": "a revoked agent stays revoked: to bring the machine back, `specfleet token create` here "
    "and `specfleet agent enrol --token T` on it",
    "idle": "it takes jobs already: `specfleet agents drain ID` first if you meant to stop it taking jobs",
    "busy": "it runs a job and takes the next one already: `specfleet agents drain ID` stops it after this job",
    "enrolled": "it has not run yet and takes jobs once `specfleet agent run` starts on it",
    "draining": "it finishes its job and takes no other already: `specfleet agents undrain ID` lets it take jobs",
}


def cmd_agents_set_state(args) -> int:
    import grpc

    from protos.specfleet.v1 import fleet_pb2 as pb

    try:
        _admin(args).SetAgentState(pb.SetAgentStateRequest(agent_id=args.agent_id, state=args.state))
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.NOT_FOUND:
            raise ValueError(f"{e.details()}: `specfleet agents list` shows the agents and their ids") from None
        if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
            raise
        words = e.details().split()  # "agent ID is STATE; ..."
        current = words[3].rstrip(";,") if len(words) > 3 and words[1:3] == [args.agent_id, "is"] else ""
        hint = STATE_CHANGE_HINTS.get(current, "`specfleet agents list` shows the state it is in")
        raise ValueError(f"{e.details()}: {hint.replace('ID', args.agent_id)}") from None
    print(f"agent {args.agent_id}: {args.state}")
    return 0


# ---------------------------------------------------------------- sweeps


def cmd_sweep_submit(args) -> int:
    from protos.specfleet.v1 import fleet_pb2 as pb
    from specfleet.sweeps import SweepError, parse_sweep

    try:
        text = Path(args.file).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read sweep file {args.file}: {e.strerror if isinstance(e, OSError) else e}") from None
    try:
        parse_sweep(text, args.file)  # the coordinator validates too; this names each problem (file:line) on a line
    except SweepError as e:
        print(
            f"error: {args.file} is not a valid sweep ({len(e.problems)} problem(s)); nothing was submitted:",
            file=sys.stderr,
        )
        for problem in e.problems[:MAX_PRINTED_PROBLEMS]:
            print(f"  {problem}", file=sys.stderr)
        if len(e.problems) > MAX_PRINTED_PROBLEMS:
            print(f"  and {len(e.problems) - MAX_PRINTED_PROBLEMS} more", file=sys.stderr)
        return 1
    resp = _admin(args).SubmitSweep(pb.SubmitSweepRequest(yaml=text))
    print(f"sweep {resp.sweep_id}: {resp.jobs} job(s) queued")
    for note in resp.notes:
        print(f"  note: {note}")
    for line in resp.uncovered:
        print(f"  not run: {line}")
    return 0


def print_sweep(s) -> None:
    finished = s.jobs_done + s.jobs_failed + s.jobs_held
    held = f", held {s.jobs_held} ({s.runs_held} runs held by their agents)" if s.jobs_held else ""
    print(
        f"{s.sweep_id}  {s.name:24} {s.state:9} {finished}/{s.jobs_total} jobs finished "
        f"(queued {s.jobs_queued}, running {s.jobs_running}, done {s.jobs_done}, failed {s.jobs_failed}{held}), "
        f"{s.runs} runs"
    )
    for line in s.uncovered:
        print(f"    not run: {line}")
    for failure in s.failures:
        print(f"    failed {one_line(failure)}")  # a job stored before reasons were one line, too


def cmd_sweep_status(args) -> int:
    """One snapshot of the sweep (or of all); with --watch, its progress until it ends (every
    sweep running now, without an id): exit status 0 when all ended done without a failed job."""
    from protos.specfleet.v1 import fleet_pb2 as pb

    admin = _admin(args)

    def fetch(ids=None):
        if args.sweep_id:
            return [admin.GetSweep(pb.GetSweepRequest(sweep_id=args.sweep_id))]
        return [s for s in admin.ListSweeps(pb.ListSweepsRequest()).sweeps if ids is None or s.sweep_id in ids]

    sweeps = fetch()
    if not getattr(args, "watch", False):
        for s in sweeps:
            print_sweep(s)
        return 0
    from rich.console import Console

    from cli.watch import watch

    running = {s.sweep_id for s in sweeps if s.state == "running"}
    if not running:
        for s in sweeps:
            print_sweep(s)
        print("no running sweep to watch", file=sys.stderr)
        return 0 if all(s.state == "done" and not s.jobs_failed for s in sweeps) else 1
    final = watch(lambda: fetch(running), Console(), args.interval)
    return 0 if all(s.state == "done" and not s.jobs_failed for s in final) else 1


def cmd_sweep_cancel(args) -> int:
    from protos.specfleet.v1 import fleet_pb2 as pb

    resp = _admin(args).CancelSweep(pb.CancelSweepRequest(sweep_id=args.sweep_id))
    print(f"sweep {args.sweep_id}: cancelled {resp.jobs_cancelled} open job(s)")
    return 0


# ---------------------------------------------------------------- agent


def cmd_agent_enrol(args) -> int:
    from agent import retry
    from agent.credentials import AgentIdentity
    from agent.fingerprint import available_engines, engine_problems, fingerprint
    from specfleet import client as api

    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            sys.exit(f"error: --label {item!r} must look like key=value")
        labels[key] = value
    fp = fingerprint()
    name = args.name or fp.hostname.split(".")[0]
    client = api.AgentApi(api.channel(args.coordinator, **_tls_files(args)))
    problems = engine_problems()  # an engine this machine cannot load is named, never just left out
    for engine, problem in problems.items():
        print(f"warning: engine {engine} cannot run here, so this agent enrols without it: {problem}", file=sys.stderr)
    engines = available_engines(problems=problems)
    resp = retry.call(lambda: client.enrol(args.token, name, fp, labels, engines), retry.ENROL, "enrol")
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
        from agent.config import load_field

        dirs = load_field("model_dirs", Path(args.config_dir), {"model_dirs": args.model_dir})
        settings.save(Path(args.config_dir), model_dirs=[str(d) for d in dirs])
    print(f"enrolled {name} as {resp.agent_id} ({fp.chip}); credential stored in {path}")
    return 0


def _agent_config(args):
    """The agent's configuration from `agent run`'s (or `install-service`'s) flags, the
    environment and settings.json (agent/config.py)."""
    from agent.config import FIELDS, AgentConfig

    flags = {f.name: getattr(args, f.flag.lstrip("-").replace("-", "_"), None) for f in FIELDS if f.flag}
    return AgentConfig.load(Path(args.config_dir), flags)


def cmd_agent_run(args) -> int:
    from agent import doctor
    from agent.daemon import Agent

    config = _agent_config(args)
    # A failed machine check of `agent doctor` holds jobs until it passes, unless --ignore-doctor.
    hold = None if config.ignore_doctor else doctor.agent_hold(config.config_dir, list(config.model_dirs))
    agent = Agent(config, doctor_hold=hold)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: agent.stop.set())
    return agent.run()


def cmd_agent_install_service(args) -> int:
    from agent import service

    config = _agent_config(args)
    run_args = [a for d in config.model_dirs for a in ("--model-dir", str(d))]
    if config.metrics_port is not None:
        run_args += ["--metrics-port", str(config.metrics_port)]
    if config.allow_battery:
        run_args.append("--allow-battery")
    if config.ignore_doctor:
        run_args.append("--ignore-doctor")
    if config.llama_server:
        run_args += ["--llama-server", str(config.llama_server)]
    result = service.install(
        config.config_dir.resolve(),
        run_args,
        dest_dir=Path(args.dest_dir) if args.dest_dir else None,
        load=not args.no_load,
    )
    print(result.message, file=sys.stdout if result.loaded or args.no_load else sys.stderr)
    return 0 if result.loaded or args.no_load else 1


def cmd_agent_status(args) -> int:
    path = Path(args.config_dir) / "status.json"
    if not path.exists():
        sys.exit(f"error: no agent status at {path}: is `specfleet agent run` running with this --config-dir?")
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read the agent status {path} ({e}); `specfleet agent run` rewrites it") from None
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


# ---------------------------------------------------------------- import


def cmd_import(args) -> int:
    """Parse another tool's results here, every row checked, then store them all through the
    coordinator in one call (or none: a bad row refuses the whole file)."""
    import getpass

    from cli.importers import llama_bench, mtplx
    from coordinator.server import MAX_MESSAGE_BYTES
    from protos.specfleet.v1 import fleet_pb2 as pb

    path = Path(args.path)
    results = llama_bench.parse(path, args.format) if args.tool == "llama-bench" else mtplx.parse(path)
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name on this machine: the admin identity still says who
        user = ""
    request = pb.ImportResultsRequest(
        results=[r.to_proto() for r in results], machine_note=args.machine_note, local_user=user
    )
    if request.ByteSize() > MAX_MESSAGE_BYTES - 4096:
        raise ValueError(
            f"{path.name}: {len(results)} results make a {request.ByteSize()}-byte request; the coordinator takes "
            f"at most {MAX_MESSAGE_BYTES - 4096}: split the file; nothing was imported"
        )
    resp = _admin(args).ImportResults(request, timeout=120)
    print(
        f"imported {resp.stored} result(s) from {path} as {resp.imported_by}"
        f"{f' ({resp.duplicates} already stored)' if resp.duplicates else ''}; "
        "they are shown as imported and unpaired, never pooled into the fleet's speedups"
    )
    return 0


def cmd_agent_doctor(args) -> int:
    from agent import doctor

    checks = doctor.run_checks(Path(args.config_dir), args.model_dir, args.llama_server)
    print(doctor.report(checks))
    return 1 if any(c.verdict == doctor.FAIL for c in checks) else 0


# ---------------------------------------------------------------- other


def cmd_export(args) -> int:
    from coordinator.export import export_from_coordinator, export_from_data_dir

    if args.stopped:
        n = export_from_data_dir(Path(args.data_dir), Path(args.output), args.format)
    else:
        n = export_from_coordinator(_admin(args), Path(args.output), args.format)
    print(f"wrote {n} runs to {args.output}")
    return 0


def cmd_report(args) -> int:
    from cli.report import make

    if args.tls_ca:  # it reads the coordinator through the dashboard's mirror, as `specfleet dashboard` does
        sys.exit("error: specfleet report reads the coordinator without TLS, as the dashboard does: drop --tls-ca")
    print(make(_coordinator(args), _admin_token(args), args.sweep_id, args.format, Path(args.output)))
    return 0


def cmd_dashboard(args) -> int:
    from dashboard.serve import serve

    return serve(args.coordinator, args.admin_token, Path(args.data_dir), args.port, args.host)


def cmd_models_make_tiny(args) -> int:
    from cli.tiny import make_tiny

    models = make_tiny(Path(args.dir))
    for field, path in models.paths().items():
        print(f"{field:21} {path}")
    return 0


def cmd_models_quantize(args) -> int:
    from cli.quantize import quantize

    try:
        print(quantize(Path(args.src), Path(args.dst), args.type))
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        sys.exit(f"error: {e}")
    return 0


def cmd_models_gguf_to_mlx(args) -> int:
    from cli.gguf_to_mlx import Unsupported, convert

    try:
        print(convert(Path(args.src), Path(args.dst)))
    except (Unsupported, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
    return 0


def cmd_demo(args) -> int:
    from cli.demo import run_demo

    return run_demo(
        Path(args.data_dir),
        dashboard=not args.no_dashboard,
        dashboard_port=args.dashboard_port,
        real=args.real,
        models_dir=Path(args.models_dir),
        small=args.small,
        only=args.sweep,
        store=args.store,
    )


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


def _add_coordinator_commands(sub) -> None:
    """`specfleet coordinator serve`."""
    coord = sub.add_parser("coordinator", help="run the coordinator").add_subparsers(dest="sub", required=True)
    p = coord.add_parser("serve", help="serve gRPC and /metrics with a DuckDB file in --data-dir")
    flag(p, "--data-dir", default=str(default_data_dir()))
    flag(p, "--host", default="127.0.0.1")
    flag(p, "--port", type=int, default=50551)
    flag(p, "--metrics-port", type=int, default=9464, help="-1 disables /metrics")
    flag(p, "--lease-seconds", type=_positive(float), default=60.0)
    flag(p, "--tls-cert", help="serve gRPC and /metrics over TLS with this certificate")
    flag(p, "--tls-key", help="the certificate's key")
    flag(p, "--tls-client-ca", help="require client certificates (mTLS)")
    flag(
        p,
        "--store",
        default="file",
        help="'file' (one DuckDB file in --data-dir) or ducklake:postgres://USER@HOST:PORT/DB?data_path=DIR,"
        " a DuckLake several coordinators share",
    )
    flag(p, "--name", env="COORDINATOR_NAME", default="", help="its label on /metrics (specfleet_coordinator_info)")
    flag(p, "--lake-upkeep-seconds", type=float, default=3600.0, help="between the lake's upkeep passes; 0: none")
    p.set_defaults(fn=cmd_coordinator_serve)


def _add_token_commands(sub) -> None:
    """`specfleet token create`."""
    token = sub.add_parser("token", help="enrolment tokens").add_subparsers(dest="sub", required=True)
    p = token.add_parser("create", help="create an expiring enrolment token")
    flag(p, "--ttl", env="TOKEN_TTL", type=_positive(float), default=3600.0, help="seconds until it expires")
    flag(p, "--max-uses", env="TOKEN_MAX_USES", type=_positive(int), default=1)
    flag(p, "--note", env="TOKEN_NOTE", default="")
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_token_create)


def _add_agents_commands(sub) -> None:
    """`specfleet agents list|revoke|drain|undrain`."""
    agents = sub.add_parser("agents", help="the fleet's agents").add_subparsers(dest="sub", required=True)
    p = agents.add_parser("list")
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_agents_list)
    for verb, state, what in (
        ("revoke", "revoked", "refuse the agent's credential for good (revoked is final)"),
        ("drain", "draining", "let the agent finish its job and take no new one"),
        ("undrain", "idle", "let a draining agent take jobs again"),
    ):
        p = agents.add_parser(verb, help=what)
        p.add_argument("agent_id")
        _add_admin_flags(p)
        p.set_defaults(fn=cmd_agents_set_state, state=state)


def _add_sweep_commands(sub) -> None:
    """`specfleet sweep submit|status|list|cancel`."""
    sweep = sub.add_parser("sweep", help="benchmark sweeps").add_subparsers(dest="sub", required=True)
    p = sweep.add_parser("submit", help="validate a sweep file and queue its jobs")
    p.add_argument("file")
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_sweep_submit)
    p = sweep.add_parser("status", help="progress of one sweep, or of all")
    p.add_argument("sweep_id", nargs="?")
    flag(
        p,
        "--watch",
        env="SWEEP_WATCH",
        action="store_true",
        help="follow the sweep (every running sweep, without an id) until it ends: bars on a terminal, "
        "a line per change when piped; exit status 1 when a job failed",
    )
    flag(p, "--interval", env="SWEEP_WATCH_INTERVAL", type=_positive(float), default=2.0, help="seconds between polls")
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_sweep_status)
    p = sweep.add_parser("list", help="every sweep with its progress")
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_sweep_status, sweep_id=None)
    p = sweep.add_parser("cancel")
    p.add_argument("sweep_id")
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_sweep_cancel)


def _add_agent_commands(sub, config_dir: dict) -> None:
    """`specfleet agent enrol|run|install-service|status|doctor|spool`: this machine as an agent; `config_dir` the
    keywords of their --config-dir."""
    ag = sub.add_parser("agent", help="run this machine as an agent").add_subparsers(dest="sub", required=True)
    p = ag.add_parser("enrol", help="enrol this machine with a token")
    flag(p, "--coordinator", required=True, help="HOST:PORT")
    flag(p, "--token", required=True, help="an enrolment token from `specfleet token create`")
    flag(p, "--name", env="AGENT_NAME", help="this machine's name in the fleet (default: its host name)")
    flag(p, "--label", env="LABELS", action="append", help="key=value (repeatable; the variable: k=v,k=v)")
    _add_tls_client_flags(p)
    flag(p, "--config-dir", **config_dir)
    flag(
        p,
        "--model-dir",
        env="MODEL_DIRS",
        separator=os.pathsep,
        action="append",
        help=f"directory whose models jobs may use (repeatable; the variable: DIR{os.pathsep}DIR)",
    )
    p.set_defaults(fn=cmd_agent_enrol)
    p = ag.add_parser("run", help="take jobs until stopped")
    flag(p, "--config-dir", **config_dir)
    _add_agent_run_flags(p)
    flag(
        p,
        "--allow-downloads",
        action="store_true",
        help="let jobs download Hugging Face models missing from the cache (default: cache only)",
    )
    p.set_defaults(fn=cmd_agent_run)
    p = ag.add_parser("install-service", help="run the agent at login: launchd on macOS, systemd --user on Linux")
    flag(p, "--config-dir", **config_dir)
    _add_agent_run_flags(p)
    flag(p, "--no-load", env="SERVICE_NO_LOAD", action="store_true", help="write the service file only")
    flag(
        p,
        "--dest-dir",
        env="SERVICE_DEST_DIR",
        help="where to write it (default: ~/Library/LaunchAgents or ~/.config/systemd/user)",
    )
    p.set_defaults(fn=cmd_agent_install_service)
    p = ag.add_parser("status", help="current job, spool depth, last contact")
    flag(p, "--config-dir", **config_dir)
    p.set_defaults(fn=cmd_agent_status)
    p = ag.add_parser(
        "doctor", help="should this machine measure now? each check with a verdict and a fix; exit 1 if one fails"
    )
    flag(p, "--config-dir", **config_dir)
    _add_job_resource_flags(p)
    p.set_defaults(fn=cmd_agent_doctor)
    from cli import spool as spool_commands

    spool_commands.add_parsers(ag, flag, config_dir)


def _add_import_commands(sub) -> None:
    """`specfleet import llama-bench|mtplx`."""
    from cli.importers import LLAMA_BENCH_FORMATS

    imports = sub.add_parser("import", help="results measured by other tools, stored apart from the fleet's runs")
    imports = imports.add_subparsers(dest="sub", required=True)
    for tool, what, metavar in (
        ("llama-bench", "llama-bench's -o json, jsonl, csv or sql output", "FILE"),
        ("mtplx", "a `mtplx bench run` directory (envelope.json) and `mtplx tune` results in it", "DIR"),
    ):
        p = imports.add_parser(tool, help=what)
        p.add_argument("path", metavar=metavar)
        if tool == "llama-bench":
            flag(p, "--format", env="IMPORT_FORMAT", choices=("auto", *LLAMA_BENCH_FORMATS), default="auto")
        flag(p, "--machine-note", env="IMPORT_MACHINE_NOTE", default="", help="your words on the machine that ran it")
        _add_admin_flags(p)
        p.set_defaults(fn=cmd_import, tool=tool)


def _add_export_commands(sub) -> None:
    """`specfleet export`."""
    p = sub.add_parser("export", help="one row per run, every parameter and metric")
    flag(p, "--format", env="EXPORT_FORMAT", choices=("parquet", "csv"), default="parquet")
    flag(p, "--output", env="EXPORT_OUTPUT", required=True, help="the file to write")
    flag(
        p,
        "--stopped",
        env="EXPORT_STOPPED",
        action="store_true",
        help="read --data-dir's file directly (coordinator stopped)",
    )
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_export)


def _add_report_commands(sub) -> None:
    """`specfleet report`."""
    p = sub.add_parser("report", help="one sweep's report: Markdown with PNG plots, or one HTML file")
    p.add_argument("sweep_id")
    flag(p, "--format", env="REPORT_FORMAT", choices=("md", "html"), default="md")
    flag(p, "--output", env="REPORT_OUTPUT", required=True, help="directory for report.md and its PNGs, or report.html")
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_report)


def _add_dashboard_commands(sub) -> None:
    """`specfleet dashboard`."""
    p = sub.add_parser("dashboard", help="serve the Streamlit dashboard")
    flag(p, "--host", env="DASHBOARD_HOST", default="127.0.0.1")
    flag(p, "--port", env="DASHBOARD_PORT", type=int, default=8501)
    _add_admin_flags(p)
    p.set_defaults(fn=cmd_dashboard)


def _add_models_commands(sub) -> None:
    """`specfleet models make-tiny|quantize|gguf-to-mlx`."""
    models = sub.add_parser("models", help="model utilities").add_subparsers(dest="sub", required=True)
    p = models.add_parser("make-tiny", help="build the tiny target and draft (MLX dir + GGUF) offline")
    p.add_argument("dir")
    p.set_defaults(fn=cmd_models_make_tiny)
    p = models.add_parser("quantize", help="requantise a GGUF with llama.cpp's quantiser (TYPE: Q8_0, F16, Q2_K, ...)")
    p.add_argument("src"), p.add_argument("dst"), p.add_argument("type")
    p.set_defaults(fn=cmd_models_quantize)
    p = models.add_parser("gguf-to-mlx", help="a llama-family GGUF (Q4_0, Q4_1, Q8_0, F16) as an MLX model directory")
    p.add_argument("src"), p.add_argument("dst")
    p.set_defaults(fn=cmd_models_gguf_to_mlx)


def _add_demo_commands(sub) -> None:
    """`specfleet demo`."""
    p = sub.add_parser("demo", help="the whole fleet on this machine with tiny models")
    flag(p, "--data-dir", env="DEMO_DIR", default=".data/demo")
    flag(p, "--no-dashboard", env="DEMO_NO_DASHBOARD", action="store_true", help="exit when the sweep is done")
    flag(p, "--dashboard-port", env="DASHBOARD_PORT", type=int, default=8501)
    flag(p, "--real", env="DEMO_REAL", action="store_true", help="the real models of scripts/setup.sh --real-models")
    flag(p, "--models-dir", env="MODELS_DIR", default=".data/models", help="where --real finds them")
    flag(p, "--small", env="DEMO_SMALL", action="store_true", help="every sweep and arm, one prompt and repeat")
    flag(p, "--sweep", env="DEMO_SWEEPS", action="append", help="only this sweep of the demo (repeatable)")
    flag(p, "--store", env="DEMO_STORE", choices=["file", "lake"], default="file",
         help="lake: the coordinator on a DuckLake with a PostgreSQL catalog the demo starts")  # fmt: skip
    p.set_defaults(fn=cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    from agent.config import default_config_dir
    from cli import store as store_commands

    parser = Parser(prog="specfleet", description=__doc__)
    flag(parser, "--verbose", action="store_true", help="log at debug level; a traceback with an internal error")
    sub = parser.add_subparsers(dest="command", required=True)
    config_dir = {"default": str(default_config_dir()), "help": "where agent.json and settings.json live"}
    _add_coordinator_commands(sub)
    store_commands.add_parsers(sub, flag)
    _add_token_commands(sub)
    _add_agents_commands(sub)
    _add_sweep_commands(sub)
    _add_agent_commands(sub, config_dir)
    _add_import_commands(sub)
    _add_export_commands(sub)
    _add_report_commands(sub)
    _add_dashboard_commands(sub)
    _add_models_commands(sub)
    _add_demo_commands(sub)
    return parser


def one_line(text: str) -> str:
    """An error's text on one line, at most MAX_ERROR_CHARS long."""
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    """Run one command; an error is one line on stderr and exit status 1 (2 for a usage error),
    an interrupt exit status 130. An unexpected error says so; --verbose adds its traceback."""
    if os.environ.get("SPECFLEET_LIFELINE_FD"):  # started by a specfleet command: end when it ends
        from dashboard.serve import hold_lifeline

        hold_lifeline()
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("gguf").setLevel(logging.WARNING)
    import grpc

    from agent.retry import FatalApiError

    try:
        return args.fn(args)
    except grpc.RpcError as e:
        message = f"{e.code().name}: {e.details()}"
    except (FatalApiError, OSError, ValueError, RuntimeError) as e:
        message = str(e) or type(e).__name__
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if args.verbose:
            traceback.print_exc()
        message = f"internal error: {type(e).__name__}: {e} (--verbose shows where)"
    print(f"error: {one_line(message)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
