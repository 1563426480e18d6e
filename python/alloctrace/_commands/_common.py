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

from .. import _report

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


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, not {value}")
    return value


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
            return alloctrace.Snapshot.load(path, allow_pickle=allow_pickle)
    except alloctrace.SnapshotFormatError as exc:
        raise CommandError(_describe(exc, path)) from None
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
    return made, described


def loaded_and_filtered(path: str, args: argparse.Namespace):
    snapshot = load(path, args.allow_pickle)
    chosen, _ = filters(args)
    return snapshot.filter_traces(chosen) if chosen else snapshot


def totals(snapshot) -> tuple[int, int]:
    """Size and count of all traces: grouping by file counts each block exactly once."""
    stats = snapshot.statistics("filename")
    return sum(stat.size for stat in stats), sum(stat.count for stat in stats)


def check_key(args: argparse.Namespace) -> None:
    if args.cumulative and (args.key == "traceback" or args.key in KIND_KEYS):
        raise CommandError(
            f"--cumulative works with --key lineno or filename, not {args.key}", USAGE_ERROR
        )


def check_objects(path: str, snapshot, args: argparse.Namespace) -> None:
    """Object-kind keys need a snapshot that recorded kinds: say so, naming the file."""
    if args.key in KIND_KEYS and not getattr(snapshot, "has_objects", False):
        raise CommandError(
            f"{path} has no object kinds, needed for --key {args.key}: take it with "
            "take_snapshot(objects=True) or run the program with ALLOCTRACE_OBJECTS=1"
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


def header(path: str, snapshot) -> str:
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
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(metadata["timestamp"]))
        parts.append(stamp)
    return f"{path} ({', '.join(parts)})"


def write_lines(lines: Sequence[str]) -> None:
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def write_json(document: dict[str, Any]) -> None:
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    sys.stdout.flush()


def write_export(output: str, write) -> None:
    """Runs ``write(output)``, turning its failures into one-line errors."""
    try:
        with Progress(f"writing {output}"):
            write(output)
    except OSError as exc:
        # The native message names the temporary file; the user named only the output.
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise CommandError(f"cannot write {output}: {reason}") from None
    except ValueError as exc:
        raise CommandError(str(exc)) from None


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
    add_pickle_option(parser)
    parser.set_defaults(key="lineno", cumulative=False, filters=None, json=False, full_paths=False)


def add_export_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="file to write")
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


def add_pickle_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="also read tracemalloc.Snapshot.dump() files (pickles: only for trusted files)",
    )
