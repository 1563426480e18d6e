"""``alloctrace attach PID`` and ``alloctrace detach PID``: start and stop tracing in a running
CPython process started without alloctrace (see :mod:`alloctrace._attach`)."""

from __future__ import annotations

import argparse
import os

from .. import _startup
from . import _common as common

DEFAULT_SIGNAL = "SIGUSR2"


def register(commands) -> None:
    attach = commands.add_parser(
        "attach",
        help="start tracing in a running Python process (needs lldb); snapshots then come from "
        "'alloctrace snapshot PID'",
        description="Start tracing inside a running CPython 3.9-3.13 process that was started "
        "without alloctrace, through lldb. alloctrace must be importable from the process's "
        "sys.path. The process keeps running; tracing starts in its main thread at its next "
        "point between two bytecodes.",
    )
    common.add_process_arguments(attach, "the process to reach a point where Python code runs")
    common.add_nframe_option(attach)
    attach.add_argument(
        "--sample-interval",
        metavar="BYTES",
        help="sampled tracing, one sample per BYTES allocated on average (e.g. 512KiB)",
    )
    attach.add_argument(
        "--native",
        action="store_true",
        help="also trace the malloc and mmap calls of extension modules ('native' domain)",
    )
    attach.add_argument(
        "--signal",
        default=DEFAULT_SIGNAL,
        metavar="SIG",
        help=f"the signal 'alloctrace snapshot PID' sends for a snapshot (default: "
        f"{DEFAULT_SIGNAL}); the program must not use it",
    )
    attach.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="where snapshots go; may contain {pid}, {time}, {n} (default: "
        "alloctrace-{pid}-{n}.snap in the current directory; with --duration, "
        "alloctrace-{pid}.snap)",
    )
    attach.add_argument(
        "--duration",
        type=common.seconds,
        metavar="SECONDS",
        help="write one snapshot to FILE after SECONDS, then stop tracing and print its path",
    )
    attach.set_defaults(handler=execute_attach)

    detach = commands.add_parser(
        "detach",
        help="stop the tracing 'alloctrace attach' started in a process",
        description="Stop the tracing 'alloctrace attach' started, hand the allocators back "
        "and remove the snapshot signal's handler. The process keeps running.",
    )
    common.add_process_arguments(detach, "the process")
    detach.set_defaults(handler=execute_detach)


def execute_attach(args: argparse.Namespace) -> int:
    from .. import _attach

    options: dict = {"nframe": args.nframe, "native": bool(args.native)}
    try:
        if args.sample_interval is not None:
            interval = _startup.parse_sample_interval(args.sample_interval, "--sample-interval")
            options["sample_interval"] = interval or None
        if args.duration is not None:
            output = args.output or "alloctrace-{pid}.snap"
            _startup.check_path_template(output, "-o/--output")
            options["duration"] = args.duration
            options["output"] = os.path.abspath(output)
            options["dump"] = os.path.abspath(output)
            options["signal"] = None
        else:
            output = args.output or "alloctrace-{pid}-{n}.snap"
            _startup.check_path_template(output, "-o/--output")
            options["dump"] = os.path.abspath(output)
            options["signal"] = _startup.parse_signal(args.signal)
    except _startup.ConfigError as exc:
        message = str(exc).replace(f"{_startup.ENV_SIGNAL}=", "--signal ")
        raise common.CommandError(message, common.USAGE_ERROR) from None
    try:
        status = _attach.request(args.pid, "start", options, args.timeout)
    except _attach.AttachError as exc:
        raise common.CommandError(str(exc)) from None
    if args.duration is not None:
        common.write_lines([status["path"]])
        return 0
    import signal

    name = signal.Signals(options["signal"]).name
    common.write_lines(
        [
            f"tracing process {args.pid} (Python {status['version']}, {status['executable']}), "
            f"{args.nframe} frame{'s' if args.nframe != 1 else ''}; "
            f"'alloctrace snapshot {args.pid}' writes "
            f"{options['dump'].replace('{pid}', str(args.pid))} ({name}), "
            f"'alloctrace detach {args.pid}' stops"
        ]
    )
    return 0


def execute_detach(args: argparse.Namespace) -> int:
    from .. import _attach

    try:
        _attach.request(args.pid, "stop", {}, args.timeout)
    except _attach.AttachError as exc:
        raise common.CommandError(str(exc)) from None
    common.write_lines([f"stopped tracing process {args.pid}"])
    return 0
