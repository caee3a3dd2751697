"""``ember agent``: its arguments, folded over the YAML configuration (the
command line wins), and a run that hands the result to the agent."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError
from ._common import Command, int_arg, stop_and_reload_events

if TYPE_CHECKING:
    from ..config import AgentConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file (see config/ember.yaml)")
    p.add_argument("--collector", help="collector gRPC address HOST:PORT")
    p.add_argument("--interval", help="drain and ship interval, e.g. 10s")
    p.add_argument("--pid", type=int_arg, action="append", default=[],
                   help="profile only this process (repeatable)")
    p.add_argument("--metrics-listen", help="HOST:PORT for /metrics, /healthz, /readyz")
    p.add_argument("--spool-dir", help="directory of the on-disk spool")
    p.add_argument("--frequency", type=int_arg, help="on-CPU samples per second per CPU")


def run(args: argparse.Namespace) -> int:
    from ..agent.controller import Agent

    agent_cfg = _config(args)
    stop, reload = stop_and_reload_events()
    agent = Agent(agent_cfg, config_path=args.config)
    agent.run(stop, reload)
    return 0


def _config(args: argparse.Namespace) -> AgentConfig:
    """The config file's agent section with the options given here applied."""
    from .. import config

    cfg = config.load(args.config)
    targets = cfg.agent.targets
    if args.pid:
        for pid in args.pid:
            if pid <= 0 or not Path(f"/proc/{pid}").is_dir():
                raise UsageError(f"no process with PID {pid}")
        targets = config.override(targets, pids=tuple(args.pid))
    try:
        agent_cfg: AgentConfig = config.override(
            cfg.agent, targets=targets,
            collector=config.parse_hostport(args.collector) if args.collector else None,
            interval=config.parse_duration(args.interval) if args.interval else None,
            metrics_listen=(config.parse_hostport(args.metrics_listen)
                            if args.metrics_listen else None),
            spool_dir=args.spool_dir, frequency=args.frequency)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not 1 <= agent_cfg.interval <= 3600:
        raise UsageError(f"--interval must be between 1s and 1h, not {args.interval}")
    return agent_cfg


COMMAND = Command(
    name="agent", help="profile continuously and ship to a collector",
    description="Profile on-CPU and off-CPU continuously; ship pprof "
                "profiles to a collector over gRPC (Parca WriteRaw).",
    add_arguments=add_arguments, run=run)
