"""`specfleet agent spool list|retry`: the agent's parked records (agent/spool.py), with their
reasons, and putting them back in the upload queue once their cause is gone (the coordinator
upgraded, the disk freed, a lease bug fixed). A running agent uploads a re-queued record within
a second; a stopped one at its next start."""

from __future__ import annotations

import time
from pathlib import Path

from agent.spool import Spool, StillRefused

REASON_CHARS = 160  # of each reason, in the list


def cmd_list(args) -> int:
    spool = Spool(Path(args.config_dir) / "spool")
    parked = spool.parked()
    if not parked:
        print(f"no parked records in {spool.refused} ({spool.depth()} pending)")
        return 0
    print(f"{'RUN ID':36}  {'PARKED AT':19}  REASON")
    for p in parked:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p.parked_at))
        reason = p.reason if len(p.reason) <= REASON_CHARS else p.reason[: REASON_CHARS - 3] + "..."
        print(f"{p.run_id:36}  {when:19}  {reason or '(no reason kept)'}")
    print(f"{len(parked)} parked, {spool.depth()} pending; `specfleet agent spool retry --all` re-queues them")
    return 0


def cmd_retry(args) -> int:
    """Re-queue the named parked records (or all); 1 when one was refused or unknown, each named."""
    spool = Spool(Path(args.config_dir) / "spool")
    if bool(args.run_ids) == args.all:
        raise ValueError("name the parked runs to retry, or give --all (see `specfleet agent spool list`)")
    run_ids = [p.run_id for p in spool.parked()] if args.all else args.run_ids
    queued, problems = 0, []
    for run_id in run_ids:
        try:
            spool.requeue(run_id)
            queued += 1
        except StillRefused as e:
            problems.append(str(e))
        except KeyError as e:
            problems.append(e.args[0])
    for problem in problems:
        print(f"not re-queued: {problem}")
    print(f"{queued} re-queued for upload, {len(problems)} not")
    return 1 if problems else 0


def add_parsers(agent_commands, flag, config_dir: dict) -> None:
    """`spool list` and `spool retry` under `specfleet agent`, with cli/main.py's `flag` (every
    flag has its SPECFLEET_ variable) and the other agent commands' --config-dir."""
    spool = agent_commands.add_parser("spool", help="parked runs: list them, re-queue them")
    spool = spool.add_subparsers(dest="spool_command", required=True)
    p = spool.add_parser("list", help="the parked runs with their reasons")
    flag(p, "--config-dir", **config_dir)
    p.set_defaults(fn=cmd_list)
    p = spool.add_parser("retry", help="put parked runs back in the upload queue (refused by name if still bad)")
    p.add_argument("run_ids", nargs="*", metavar="RUN_ID")
    flag(p, "--all", env="SPOOL_RETRY_ALL", action="store_true", help="every parked run")
    flag(p, "--config-dir", **config_dir)
    p.set_defaults(fn=cmd_retry)
