"""What the subcommands share: one-line errors, argument types and options, loading snapshots,
progress notices, and writing text or JSON.

Every failure a command can foresee is a :class:`CommandError`, which the dispatch
(``_commands.main``) prints as one line on stderr with its exit status.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from .. import _report, _source
from .._snapshot import totals as totals  # the commands' sums (start-up uses it too)

PROG = "alloctrace"
KEY_TYPES = ("lineno", "filename", "traceback", "type", "lineno+type")
#: Keys that group by object kind: they need snapshots taken with objects=True.
KIND_KEYS = ("type", "lineno+type")
DEFAULT_LIMIT = 10

#: Status for bad usage (as argparse), and for an unreadable snapshot or other failure.
USAGE_ERROR = 2
FAILURE = 1


class CommandError(Exception):
    """A failure to report as one line on stderr; the command exits with *status*."""

    def __init__(self, message: str, status: int = FAILURE):
        super().__init__(message)
        self.status = status


class Parser(argparse.ArgumentParser):
    """argparse, but with one-line errors instead of a usage block on stderr."""

    def error(self, message: str) -> NoReturn:
        raise CommandError(f"{message} (see '{self.prog} --help')", USAGE_ERROR)


def unrecognized(extras: list[str], parser: argparse.ArgumentParser, command: str | None) -> str:
    """The error for arguments no option took: each unknown option with the known one it is
    probably a misspelling of (``--limt`` -> ``--limit``), and the help to read."""
    import difflib

    target = parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            target = action.choices[command]
    known = [option for action in target._actions for option in action.option_strings]
    words = []
    for extra in extras:
        name = extra.partition("=")[0]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6) if name[:1] == "-" else []
        words.append(f"{extra} (did you mean {close[0]}?)" if close else extra)
    return f"unrecognized arguments: {' '.join(words)} (see '{target.prog} --help')"


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None


def positive_int(text: str) -> int:
    value = _whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, not {value}")
    return value


def nframe(text: str) -> int:
    """``-n/--nframe``: frames kept per traceback, 1 to ``MAX_NFRAME``, as ``ALLOCTRACE``."""
    from .._startup import MAX_NFRAME

    value = _whole_number(text)
    if not 1 <= value <= MAX_NFRAME:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_NFRAME}, not {value}")
    return value


def seconds(text: str) -> float:
    """A duration: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, not {text!r}")
    return value


def add_nframe_option(parser: argparse.ArgumentParser) -> None:
    """``-n/--nframe``, as run and attach take it."""
    parser.add_argument(
        "-n",
        "--nframe",
        type=nframe,
        default=1,
        metavar="NFRAME",
        help="frames kept per traceback (default: 1; 1 to 65535)",
    )


def add_process_arguments(parser: argparse.ArgumentParser, waits_for: str) -> None:
    """The process id and ``--timeout``, as the commands that ask a running process take them;
    *waits_for* says what the timeout waits for."""
    parser.add_argument("pid", type=int, help="the process id")
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help=f"how long to wait for {waits_for} (default: 30)",
    )


# --------------------------------------------------------------------------- progress


class Progress:
    """Elapsed-time notice on stderr for slow steps on big snapshots, only on a terminal.

    Nothing is printed for steps under half a second, nor when stderr is a file or a pipe, so
    scripted use and tests see clean output.
    """

    DELAY = 0.5

    def __init__(self, message: str):
        self.message = message
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = False

    def __enter__(self) -> Progress:
        try:
            interactive = sys.stderr.isatty()
        except (AttributeError, ValueError):
            interactive = False
        if interactive:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        start = time.monotonic()
        if self._stop.wait(self.DELAY):
            return
        while True:
            elapsed = time.monotonic() - start
            sys.stderr.write(f"\r{PROG}: {self.message}… {elapsed:.1f}s\x1b[K")
            sys.stderr.flush()
            self._shown = True
            if self._stop.wait(0.2):
                return

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


# --------------------------------------------------------------------------- loading


def load(path: str, allow_pickle: bool = False):
    import alloctrace

    try:
        with Progress(f"loading {path}"):
            snapshot = alloctrace.Snapshot.load(path, allow_pickle=allow_pickle)
        _source.note_origin(snapshot, path)
        return snapshot
    except alloctrace.SnapshotFormatError as exc:
        message = _describe(exc, path)
        # The library's advice names the API; from here the way is the option.
        message = message.replace("Snapshot.load(filename, allow_pickle=True)", "--allow-pickle")
        raise CommandError(message) from None
    except OSError as exc:
        message = exc.strerror or str(exc)
        if path not in message:
            message = f"cannot read {path}: {message}"
        raise CommandError(message) from None


def peak_of(path: str, snapshot):
    """The peak snapshot stored in *path* with *snapshot* (see ``Snapshot.peak``)."""
    peak = getattr(snapshot, "peak", None)
    if peak is None:
        raise CommandError(
            f"{path} holds no peak: only dumps written by ALLOCTRACE_DUMP (or 'alloctrace "
            "run') carry one"
        )
    return peak


def _describe(exc: Exception, path: str) -> str:
    message = str(exc) or type(exc).__name__
    return message if path in message else f"{path}: {message}"


def filters(args: argparse.Namespace) -> tuple[list, list[dict[str, Any]]]:
    """The ``--include``/``--exclude`` options as Filters, and as JSON-ready descriptions."""
    import alloctrace

    made = []
    described = []
    for inclusive, pattern in args.filters or ():
        made.append(alloctrace.Filter(inclusive, pattern))
        described.append({"inclusive": inclusive, "pattern": pattern})
    for inclusive, domain in getattr(args, "domains", None) or ():
        made.append(alloctrace.DomainFilter(inclusive, domain))
        described.append({"inclusive": inclusive, "domain": domain})
    return made, described


def filtered(snapshot, args: argparse.Namespace, path: str, strict: bool = False):
    """The snapshot with the ``--include``/``--exclude`` options applied.

    When they leave nothing of a snapshot that had traces, a note on stderr says why and shows
    how the file names are recorded (usually absolute, so ``app.py`` matches nothing where
    ``*/app.py`` would): an empty report alone would look like a program that allocated nothing.
    With *strict* (a flamegraph, which cannot be drawn empty), that is the error instead.
    """
    chosen, _ = filters(args)
    if not chosen:
        return snapshot
    # File patterns and domains each narrow the snapshot: applied as one list, tracemalloc's
    # rules would keep a block matching *any* inclusive filter of either kind.
    import alloctrace

    result = snapshot
    for group in (
        [f for f in chosen if not isinstance(f, alloctrace.DomainFilter)],
        [f for f in chosen if isinstance(f, alloctrace.DomainFilter)],
    ):
        if group:
            result = result.filter_traces(group)
    if len(result.traces) == 0 and len(snapshot.traces) > 0:
        explanation = _explain_empty_filter(snapshot, args, path)
        if strict:
            raise CommandError(explanation)
        sys.stderr.write(f"{PROG}: note: {explanation}\n")
        sys.stderr.flush()
    return result


def _explain_empty_filter(snapshot, args: argparse.Namespace, path: str) -> str:
    import fnmatch

    if not args.filters:
        shown = ", ".join(
            f"--{'' if inclusive else 'exclude-'}domain {domain}"
            for inclusive, domain in args.domains
        )
        return f"{shown} leaves no block of {path}"

    # The files of the allocation sites, biggest first: the likeliest to be meant.
    names = [stat.traceback[0].filename for stat in snapshot.statistics("filename")]
    includes = [pattern for inclusive, pattern in args.filters if inclusive]
    unmatched = [p for p in includes if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if unmatched:
        what = ", ".join(f"--include {pattern!r}" for pattern in unmatched)
        reason = f"{what} matches no file"
    else:
        reason = "the --exclude patterns drop every block the --include patterns keep"
    # A relative pattern is the usual mistake: show the file it was probably meant for.
    meant = [
        (pattern, name)
        for pattern in unmatched
        for name in names
        if fnmatch.fnmatchcase(name, "*/" + pattern.lstrip("/"))
    ]
    if meant:
        pattern, example = meant[0]
        hint = f"write '*/{pattern.lstrip('/')}' to match {example!r}"
    else:
        example = next((n for n in names if not n.startswith("<")), names[0] if names else "")
        hint = f"e.g. {example!r}: write '*/name.py' or '*/package/*'"
    return (
        f"no block of {path} is left: {reason}. Patterns match the whole file name as recorded "
        f"({hint})."
    )


def loaded_and_filtered(path: str, args: argparse.Namespace, strict: bool = False):
    """*path*'s snapshot, filtered; a capture directory, a directory of snapshots or a glob
    gives the snapshots of its processes merged into one."""
    from . import _tree

    if _tree.is_many([path]):
        return _tree.merged([path], args)
    return filtered(load(path, args.allow_pickle), args, path, strict)


def traced(snapshot) -> int:
    """The snapshot's whole traced total, when it is to be set against the RSS (computed
    only then: it costs a grouping); 0 for a snapshot without the process's figures."""
    if getattr(snapshot, "process_memory", None) is None:
        return 0
    return totals(snapshot)[0]


def check_key(args: argparse.Namespace) -> None:
    if args.cumulative and (args.key == "traceback" or args.key in KIND_KEYS):
        raise CommandError(
            f"--cumulative works with --key lineno or filename, not {args.key}", USAGE_ERROR
        )


def check_objects(path: str, snapshot, args: argparse.Namespace) -> None:
    """Object-kind keys need a snapshot that recorded kinds: say so, naming the file."""
    if args.key in KIND_KEYS and not getattr(snapshot, "has_objects", False):
        raise CommandError(
            f"{path} has no object kinds, needed for --key {args.key}: record them with "
            "'alloctrace run --objects PROGRAM', ALLOCTRACE_OBJECTS=1 next to ALLOCTRACE_DUMP, "
            "or take_snapshot(objects=True) in code"
        )


# --------------------------------------------------------------------------- rendering


def _width(stream) -> int | None:
    """The terminal width when writing to a terminal (or COLUMNS is set); else no limit."""
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):
        interactive = False
    if interactive or os.environ.get("COLUMNS"):
        return shutil.get_terminal_size().columns
    return None


def renderer(names, args: argparse.Namespace, stream) -> _report.Renderer:
    shortener = _report.PathShortener(names, enabled=not args.full_paths)
    return _report.Renderer(_width(stream), shortener, source=not args.no_source)


def names(stats) -> list[str]:
    return [frame.filename for stat in stats for frame in stat.traceback]


def limit(args: argparse.Namespace) -> int | None:
    return None if args.limit == 0 else args.limit


def format_time(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def header(path: str, snapshot, memory: str | None = None) -> str:
    """``PATH (traceback_limit=N, pid P, Python X.Y.Z, date[; memory])``."""
    metadata = getattr(snapshot, "metadata", None) or {}
    parts = [f"traceback_limit={snapshot.traceback_limit}"]
    if metadata.get("pid") is not None:
        parts.append(f"pid {metadata['pid']}")
    version = metadata.get("python_version")
    if version:
        if not isinstance(version, str):
            version = ".".join(str(part) for part in version)
        parts.append(f"Python {version}")
    if metadata.get("timestamp"):
        parts.append(format_time(metadata["timestamp"]))
    tail = "" if memory is None else f"; {memory}"
    return f"{path} ({', '.join(parts)}{tail})"


def write_lines(lines: Sequence[str]) -> None:
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def write_json(document: dict[str, Any]) -> None:
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    sys.stdout.flush()


def default_output(source: str, ending: str) -> str:
    """The file an output goes to when ``-o`` is not given: the name of *source* (a snapshot
    file, a directory, or a pattern's directory) without ``.snap``, with *ending*, in the
    current directory (``leak.snap`` -> ``leak.svg``, ``dumps/*.snap`` -> ``dumps.html``)."""
    source = source.rstrip("/")
    name = os.path.basename(source)
    if any(c in name for c in "*?["):
        # A pattern ('dir/*.snap') is named after its directory.
        name = os.path.basename(os.path.dirname(source))
    if name.endswith(".snap"):
        name = name[: -len(".snap")]
    name = "".join(c for c in name if c not in "*?[]").strip(".-_") or "alloctrace"
    return name + ending


def output_or_default(args: argparse.Namespace, source: str, ending: str) -> str:
    """``args.output``, or the default name for *source* (said on stderr, so that the user
    knows where to look)."""
    if args.output is not None:
        return args.output
    output = default_output(source, ending)
    sys.stderr.write(f"{PROG}: writing {output} (choose another name with -o)\n")
    return output


def write_export(output: str, write) -> None:
    """Runs ``write(output)``, turning its failures into one-line errors. ``-`` (or
    ``/dev/stdout``) is standard output: the file is written aside, then copied there, so
    that a redirected standard output is written to, never replaced."""
    from .. import _output

    try:
        with Progress(f"writing {output}"):
            if _output.is_stdout(output):
                _write_to_stdout(write)
            else:
                write(output)
    except OSError as exc:
        # The native message names the temporary file; the user named only the output.
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise CommandError(f"cannot write {output}: {reason}") from None
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def _write_to_stdout(write) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="alloctrace-") as directory:
        path = os.path.join(directory, "output")
        write(path)
        with open(path, "rb") as stream:
            sys.stdout.flush()
            shutil.copyfileobj(stream, sys.stdout.buffer)
            sys.stdout.flush()


# --------------------------------------------------------------------------- options


def add_report_options(parser: argparse.ArgumentParser, full: bool = True) -> None:
    parser.add_argument(
        "--limit",
        type=positive_int,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"entries shown (default: {DEFAULT_LIMIT}; 0: all)",
    )
    if full:
        parser.add_argument(
            "--key",
            choices=KEY_TYPES,
            default="lineno",
            help="group by line (default), file, whole traceback, object kind (type) or line "
            "and object kind (lineno+type; these two need snapshots taken with objects)",
        )
        parser.add_argument(
            "--cumulative",
            action="store_true",
            help="count each block for every frame of its traceback, not only the last one",
        )
        add_filter_options(parser)
    parser.add_argument("--json", action="store_true", help="versioned JSON on stdout")
    parser.add_argument(
        "--full-paths", action="store_true", help="show file names exactly as recorded"
    )
    parser.add_argument("--no-source", action="store_true", help="do not show source lines")
    add_source_from_option(parser)
    add_pickle_option(parser)
    parser.set_defaults(
        key="lineno", cumulative=False, filters=None, domains=None, json=False, full_paths=False
    )


def add_source_from_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source-from",
        action="append",
        metavar="DIR",
        default=[],
        help="show source lines of a snapshot from another machine (or one that does not say) "
        "from the files under DIR (repeatable); a snapshot of this machine needs none",
    )


def add_export_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="file to write ('-': stdout; default: the snapshot's name with this format's "
        "ending, in the current directory)",
    )
    add_filter_options(parser)
    add_pickle_option(parser)


def add_filter_options(parser: argparse.ArgumentParser) -> None:
    """--include/--exclude: Filter(True|False, PATTERN) on the allocation site's file."""
    parser.add_argument(
        "--include",
        dest="filters",
        action="append",
        type=lambda pattern: (True, pattern),
        metavar="PATTERN",
        help="keep only blocks allocated in a file matching PATTERN (fnmatch; repeatable)",
    )
    parser.add_argument(
        "--exclude",
        dest="filters",
        action="append",
        type=lambda pattern: (False, pattern),
        metavar="PATTERN",
        help="drop blocks allocated in a file matching PATTERN (fnmatch; repeatable)",
    )
    parser.add_argument(
        "--domain",
        dest="domains",
        action="append",
        type=lambda value: (True, parse_domain(value)),
        metavar="DOMAIN",
        help="keep only blocks of DOMAIN: a number (0: Python's allocators, 389047: numpy's) "
        "or 'native' (run --native); repeatable",
    )
    parser.add_argument(
        "--exclude-domain",
        dest="domains",
        action="append",
        type=lambda value: (False, parse_domain(value)),
        metavar="DOMAIN",
        help="drop blocks of DOMAIN (as --domain; repeatable)",
    )


def parse_domain(value: str) -> int:
    """A ``--domain`` value: a domain number, or a name such as ``native``."""
    from alloctrace._snapshot import domain_number

    text = value.strip()
    if text.isascii() and text.isdigit():
        return int(text)
    try:
        return domain_number(text)
    except TypeError as exc:
        # argparse shows an ArgumentTypeError's message as it is.
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_pickle_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="also read tracemalloc.Snapshot.dump() files (pickles: only for trusted files)",
    )
