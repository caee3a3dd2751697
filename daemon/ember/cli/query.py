"""``ember query``: build the collector's ``/api/v1/profile`` URL from the
arguments, fetch it (``httpserve.fetch``) and write what comes back."""

from __future__ import annotations

import argparse

from .. import model
from ..errors import UsageError
from ._common import Command, check_output, write


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--collector", required=True, help="collector HTTP URL, e.g. "
                   "http://127.0.0.1:7072")
    p.add_argument("--since", default="1h", help="how far back (default 1h)")
    p.add_argument("--match", action="append", default=[], metavar="LABEL=VALUE",
                   help="label matcher, also LABEL!=VALUE, LABEL=~REGEX, LABEL!~REGEX "
                   "(repeatable: all must hold; several LABEL=VALUE of one label: any)")
    p.add_argument("--type", default=model.CPU.name,
                   help=f"{', '.join(model.KIND_NAMES)}, or a stored type name")
    p.add_argument("--format", choices=("folded", "pprof", "json"), default="folded")
    p.add_argument("--output", "-o", default=None)
    p.add_argument("--token-file", help="file with the collector's bearer token")
    p.add_argument("--ca", help="CA certificate (PEM) for an https collector")


def profile_url(args: argparse.Namespace) -> str:
    """The query as a URL; UsageError for a matcher without '='."""
    import urllib.parse

    for m in args.match:
        if "=" not in m:
            raise UsageError(f"--match must be LABEL=VALUE (or !=, =~, !~), not {m!r}")
    params = [("since", args.since), ("type", args.type), ("format", args.format)]
    params += [("match", m) for m in args.match]
    return f"{args.collector.rstrip('/')}/api/v1/profile?{urllib.parse.urlencode(params)}"


def run(args: argparse.Namespace) -> int:
    from ..config import read_token
    from ..httpserve import fetch

    url = profile_url(args)
    token = read_token(args.token_file) if args.token_file else ""
    check_output(args.output)
    write(args.output, fetch(url, token=token, cafile=args.ca))
    return 0


COMMAND = Command(name="query", help="fetch a merged profile from a collector",
                  add_arguments=add_arguments, run=run)
