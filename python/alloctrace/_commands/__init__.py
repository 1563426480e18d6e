"""The ``alloctrace`` command line (also ``python -m alloctrace``): one module per subcommand
behind this dispatch.

``run`` traces a program from its first line and summarises the snapshot it leaves at exit;
``stats``/``top`` and ``diff`` read snapshot files written by :meth:`Snapshot.dump`, by
``ALLOCTRACE_DUMP`` or by ``run``; ``export`` and ``flamegraph`` turn them into pprof
profiles, folded stacks and SVG flamegraphs; ``why`` shows retention reports; ``report`` writes
one HTML page of a series of snapshots; ``snapshot`` asks a running process for one
(``ALLOCTRACE_SIGNAL``, ``run --signal`` or ``attach``); ``attach``/``detach`` start and stop
tracing in a running process; ``top --interval`` follows a running process's dumps live. Text
goes to people, ``--json`` to programs (rendering lives in ``_report``). Every failure is one
line on stderr and a non-zero status, never a traceback: this is a tool people point at files
they are unsure about.

A subcommand is a module with ``register(commands)``, which adds its parser to the
subcommands and sets ``handler`` (called with the parsed arguments, returning the exit status).
A subcommand that reads its own command line (``run``) is also listed in
:data:`OWN_COMMAND_LINE`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .. import _source
from . import _common as common
from . import attach, diff, export, flamegraph, push, report, run, snapshot, stats, why
from ._common import FAILURE, PROG, USAGE_ERROR, CommandError, Parser

#: In the order ``--help`` lists them.
COMMANDS = (run, stats, diff, export, flamegraph, why, report, snapshot, attach, push)

#: Subcommands handed the rest of the command line as it is, before argparse sees it.
OWN_COMMAND_LINE = {"run": run.main}


#: The start-up variables, for ``--help``: what a pip user has, without the docs folder.
VARIABLES = """\
start-up variables (read by the programs you trace; the alloctrace command itself is never
traced; run's options set them for you):
  ALLOCTRACE=NFRAME              trace from start-up, NFRAME frames per traceback (0: off)
  ALLOCTRACE_DUMP=PATH           write a snapshot at exit; {pid}, {time}, {n} are replaced
  ALLOCTRACE_INTERVAL=SECONDS    with ALLOCTRACE_DUMP: also a numbered snapshot every SECONDS
  ALLOCTRACE_SAMPLE_INTERVAL=BYTES  sampled tracing, one sample per BYTES on average (512KiB)
  ALLOCTRACE_SAMPLE_SEED=N       the sampler's seed, for repeatable runs
  ALLOCTRACE_REATTRIBUTE=0       leave objects reused from free lists on their first line
  ALLOCTRACE_OBJECTS=1           with ALLOCTRACE_DUMP: record object kinds (and retention)
  ALLOCTRACE_RETENTION=N         with ALLOCTRACE_OBJECTS: retention reports for N sites (5)
  ALLOCTRACE_NATIVE=1            also trace the C library's malloc family (native mode)
  ALLOCTRACE_MEMORY_LIMIT=LIMIT  a snapshot before memory reaches LIMIT (e.g. 2GiB, rss:80%)
  ALLOCTRACE_SIGNAL=SIGNAME      a snapshot each time the process gets SIGNAME ('snapshot')
  ALLOCTRACE_CAPTURE=DIR         every process of the tree writes its snapshot into DIR
  ALLOCTRACE_CAPTURE_KEEP=N      at most N ended processes keep their files there (100; 0: all)
  ALLOCTRACE_FILE_MODE=0644      the mode of snapshots, exports and reports (default 0600)
  ALLOCTRACE_SOURCE_PATH=DIR:DIR source lines only from Python files under these directories
  ALLOCTRACE_PUSH=URL            push memory profiles to a Pyroscope server (sampled, 512KiB)
  ALLOCTRACE_PUSH_INTERVAL=SECONDS  between two pushes (15)
  ALLOCTRACE_PUSH_TIMEOUT=SECONDS   of one request (5)
  ALLOCTRACE_SERVICE=NAME        the service_name label (default: the program's name)
  ALLOCTRACE_TAGS=K=V,...        more labels
  ALLOCTRACE_PUSH_USER=USER      basic authentication (or USER:PASSWORD@ in the URL)
  ALLOCTRACE_PUSH_PASSWORD=PW    its password
  ALLOCTRACE_PUSH_TOKEN=TOKEN    bearer token
  ALLOCTRACE_PUSH_TENANT=ID      tenant (the X-Scope-OrgID header)
An invalid value stops the program before it starts, with one line naming the variable.
Every command has its own --help; 'python -c "import alloctrace; help(alloctrace)"' documents
the API."""


def build_parser() -> Parser:
    parser = Parser(
        prog=PROG,
        description="Trace Python memory allocations and read the snapshots.",
        epilog=VARIABLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {_version()}", help="show the version"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module in COMMANDS:
        module.register(commands)
    return parser


def _version() -> str:
    import alloctrace

    return alloctrace.__version__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``alloctrace`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in OWN_COMMAND_LINE:
            return OWN_COMMAND_LINE[argv[0]](argv[1:])
        parser = build_parser()
        args, extras = parser.parse_known_args(argv)
        if extras:
            raise CommandError(common.unrecognized(extras, parser, args.command), USAGE_ERROR)
        if args.command is None:
            raise CommandError(
                "a command is required: run, stats, top, diff, export, flamegraph, why, report, "
                "snapshot, attach, detach or push",
                USAGE_ERROR,
            )
        with _source.scope(getattr(args, "source_from", ()), getattr(args, "no_source", False)):
            return args.handler(args)
    except CommandError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return exc.status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader (head, less) went away: stop quietly, as a filter should.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return FAILURE
    except Exception as exc:
        sys.stderr.write(f"{PROG}: error: {type(exc).__name__}: {exc}\n")
        return FAILURE
