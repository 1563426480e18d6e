"""``alloctrace push``: upload snapshot files to a Pyroscope-compatible server, one profile
each, stamped with the time the snapshot was taken, so that a capture made elsewhere can be
studied next to a fleet's continuous profiles."""

from __future__ import annotations

import argparse
import os
import sys

from . import _common as common
from ._common import PROG, CommandError


def register(commands) -> None:
    push = commands.add_parser(
        "push",
        help="upload snapshot files to a Pyroscope-compatible server",
        description="Upload each snapshot file as one pprof heap profile (its live memory by "
        "stack) to a Pyroscope-compatible server, stamped with the time it was taken. "
        "Credentials: user info in URL, or ALLOCTRACE_PUSH_USER/_PASSWORD, "
        "ALLOCTRACE_PUSH_TOKEN, ALLOCTRACE_PUSH_TENANT (see docs/push.md).",
    )
    push.add_argument("files", nargs="+", metavar="FILE", help="snapshot files")
    push.add_argument("--url", required=True, help="server, e.g. http://localhost:4040")
    push.add_argument(
        "--service",
        help="service_name label (default: ALLOCTRACE_SERVICE, else the snapshot's program)",
    )
    push.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="one more label (repeatable; added to ALLOCTRACE_TAGS)",
    )
    push.add_argument(
        "--timeout", type=float, default=None, help="seconds per request (default: 5)"
    )
    common.add_pickle_option(push)
    push.set_defaults(handler=execute)


def execute(args: argparse.Namespace) -> int:
    from .. import _push

    try:
        tags = _push.parse_tags(os.environ.get(_push.ENV_TAGS, ""))
        tags.update(_push.parse_tags(",".join(args.tag), "--tag"))
        config = _push.settings(
            args.url,
            timeout=args.timeout,
            service=args.service or os.environ.get(_push.ENV_SERVICE) or "alloctrace",
            tags=tags,
        )
    except ValueError as exc:
        raise CommandError(str(exc), common.USAGE_ERROR) from None
    snapshots = [(path, common.load(path, args.allow_pickle)) for path in args.files]
    sender = _push.Sender(config["target"], config["timeout"])
    for path, snapshot in snapshots:
        labels = _labels(snapshot, config, args.service)
        try:
            api = _push.push_snapshot(snapshot, sender, labels)
        except _push.PushError as exc:
            raise CommandError(f"{path}: cannot push to {config['target'].shown}: {exc}") from None
        sys.stderr.write(f"{PROG}: pushed {path} to {config['target'].shown} ({api} API)\n")
    return 0


def _labels(snapshot, config, service_given: str | None) -> dict[str, str]:
    from .. import _push

    metadata = snapshot.metadata
    service = config["service"]
    if not service_given and not os.environ.get(_push.ENV_SERVICE):
        argv = metadata.get("argv") or []
        if argv:
            service = _push.default_service_name(argv[0])
    labels = dict(config["tags"])
    labels["__name__"] = "memory"
    labels["service_name"] = service
    if metadata.get("pid") is not None:
        labels["pid"] = str(metadata["pid"])
    version = metadata.get("python_version")
    if version:
        labels["process.runtime.name"] = "cpython"
        labels["process.runtime.version"] = ".".join(str(part) for part in version[:3])
    labels["alloctrace_version"] = _push._VERSION
    return labels
