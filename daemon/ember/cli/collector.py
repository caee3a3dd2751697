"""``ember collector``: its arguments, folded over the YAML configuration
(the command line wins), and a run that serves until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..errors import UsageError
from ._common import Command, stop_and_reload_events

if TYPE_CHECKING:
    from ..config import CollectorConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file (see config/ember.yaml)")
    p.add_argument("--grpc-listen", help="HOST:PORT for gRPC WriteRaw")
    p.add_argument("--http-listen", help="HOST:PORT for the HTTP query API")
    p.add_argument("--storage",
                   help="the store: a DuckDB file (one of the older SQLite format is converted)")
    p.add_argument("--allow-public", action="store_true",
                   help="listen beyond loopback without a token")


def run(args: argparse.Namespace) -> int:
    from ..collector.server import Collector, few_heaps

    few_heaps()
    co = _config(args)
    stop, _reload = stop_and_reload_events()
    collector = Collector(co, allow_public=args.allow_public)
    collector.start()
    print(f"ember collector: gRPC {co.grpc_listen}, HTTP http://{co.http_listen}, "
          f"storage {co.storage}", file=sys.stderr, flush=True)
    collector.wait(stop)
    return 0


def _config(args: argparse.Namespace) -> CollectorConfig:
    """The config file's collector section with the options given here applied."""
    from .. import config

    cfg = config.load(args.config)
    try:
        co: CollectorConfig = config.override(
            cfg.collector,
            grpc_listen=config.parse_hostport(args.grpc_listen) if args.grpc_listen else None,
            http_listen=config.parse_hostport(args.http_listen) if args.http_listen else None,
            storage=args.storage)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return co


COMMAND = Command(
    name="collector", help="receive, store and serve profiles",
    description="Receive WriteRaw over gRPC, store samples in DuckDB, answer queries over HTTP.",
    add_arguments=add_arguments, run=run)
