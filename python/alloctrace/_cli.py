"""The ``alloctrace`` command line (also ``python -m alloctrace``).

``run`` traces a program from its first line and summarises the snapshot it leaves at exit;
``stats``/``top`` and ``diff`` read snapshot files written by :meth:`Snapshot.dump`, by
``ALLOCTRACE_DUMP`` or by ``run``; ``export`` and ``flamegraph`` turn them into pprof
profiles, folded stacks and SVG flamegraphs. Text goes to people, ``--json`` to programs
(rendering lives in ``_report``). Every failure is one line on stderr and a non-zero status,
never a traceback: this is a tool people point at files they are unsure about.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from . import _report, _startup

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


class _Parser(argparse.ArgumentParser):
    """argparse, but with one-line errors instead of a usage block on stderr."""

    def error(self, message: str) -> NoReturn:
        raise CommandError(f"{message} (see '{self.prog} --help')", USAGE_ERROR)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, not {value}")
    return value


# --------------------------------------------------------------------------- progress


class _Progress:
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

    def __enter__(self) -> _Progress:
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


def _load(path: str, allow_pickle: bool = False):
    import alloctrace

    try:
        with _Progress(f"loading {path}"):
            return alloctrace.Snapshot.load(path, allow_pickle=allow_pickle)
    except alloctrace.SnapshotFormatError as exc:
        raise CommandError(_describe(exc, path)) from None
    except OSError as exc:
        message = exc.strerror or str(exc)
        if path not in message:
            message = f"cannot read {path}: {message}"
        raise CommandError(message) from None


def _describe(exc: Exception, path: str) -> str:
    message = str(exc) or type(exc).__name__
    return message if path in message else f"{path}: {message}"


def _filters(args: argparse.Namespace) -> tuple[list, list[dict[str, Any]]]:
    import alloctrace

    filters = []
    described = []
    for inclusive, pattern in args.filters or ():
        filters.append(alloctrace.Filter(inclusive, pattern))
        described.append({"inclusive": inclusive, "pattern": pattern})
    return filters, described


def _totals(snapshot) -> tuple[int, int]:
    """Size and count of all traces: grouping by file counts each block exactly once."""
    stats = snapshot.statistics("filename")
    return sum(stat.size for stat in stats), sum(stat.count for stat in stats)


def _check_key(args: argparse.Namespace) -> None:
    if args.cumulative and (args.key == "traceback" or args.key in KIND_KEYS):
        raise CommandError(
            f"--cumulative works with --key lineno or filename, not {args.key}", USAGE_ERROR
        )


def _check_objects(path: str, snapshot, args: argparse.Namespace) -> None:
    """Object-kind keys need a snapshot that recorded kinds: say so, naming the file."""
    if args.key in KIND_KEYS and not getattr(snapshot, "has_objects", False):
        raise CommandError(
            f"{path} has no object kinds, needed for --key {args.key}: take it with "
            "take_snapshot(objects=True) or run the program with ALLOCTRACE_OBJECTS=1"
        )


def _width(stream) -> int | None:
    """The terminal width when writing to a terminal (or COLUMNS is set); else no limit."""
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):
        interactive = False
    if interactive or os.environ.get("COLUMNS"):
        return shutil.get_terminal_size().columns
    return None


def _renderer(names, args: argparse.Namespace, stream) -> _report.Renderer:
    shortener = _report.PathShortener(names, enabled=not args.full_paths)
    return _report.Renderer(_width(stream), shortener, source=not args.no_source)


def _names(stats) -> list[str]:
    return [frame.filename for stat in stats for frame in stat.traceback]


def _limit(args: argparse.Namespace) -> int | None:
    return None if args.limit == 0 else args.limit


def _header(path: str, snapshot) -> str:
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


# --------------------------------------------------------------------------- stats / diff


def _statistics(snapshot, args: argparse.Namespace):
    """Filter, group and total a snapshot: (filtered snapshot, statistics, size, count)."""
    filters, _ = _filters(args)
    if filters:
        snapshot = snapshot.filter_traces(filters)
    with _Progress("computing statistics"):
        stats = snapshot.statistics(args.key, cumulative=args.cumulative)
        total_size, total_count = _totals(snapshot)
    return snapshot, stats, total_size, total_count


def render_stats(path: str, snapshot, args: argparse.Namespace, stream) -> list[str]:
    """The text of ``alloctrace stats`` for an already loaded snapshot."""
    snapshot, stats, total_size, total_count = _statistics(snapshot, args)
    limit = _limit(args)
    shown = stats if limit is None else stats[:limit]
    renderer = _renderer(_names(shown), args, stream)
    shown_count = len(stats) if limit is None else min(limit, len(stats))
    names = _report.KEY_SINGULAR if shown_count == 1 else _report.KEY_TITLES
    what = names[args.key] + (" (cumulative)" if args.cumulative else "")
    count = "All" if limit is None else f"Top {shown_count}"
    title = f"{count} {what} in {_header(path, snapshot)}"
    lines = renderer.stats(
        stats,
        key_type=args.key,
        cumulative=args.cumulative,
        limit=limit,
        total_size=total_size,
        total_count=total_count,
        title=title,
    )
    note = _report.sampling_note(snapshot)
    if note is not None:
        # A line of its own under the title, so a narrow terminal cannot cut it off.
        lines.insert(1, f"({note})")
    return lines


def _cmd_stats(args: argparse.Namespace) -> int:
    _check_key(args)
    snapshot = _load(args.file, args.allow_pickle)
    _check_objects(args.file, snapshot, args)
    if args.json:
        _, described = _filters(args)
        snapshot, stats, total_size, total_count = _statistics(snapshot, args)
        document = _report.stats_json(
            stats,
            path=args.file,
            snapshot=snapshot,
            key_type=args.key,
            cumulative=args.cumulative,
            limit=_limit(args),
            filters=described,
            total_size=total_size,
            total_count=total_count,
        )
        _write_json(document)
        return 0
    _write_lines(render_stats(args.file, snapshot, args, sys.stdout))
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    _check_key(args)
    old = _load(args.old, args.allow_pickle)
    new = _load(args.new, args.allow_pickle)
    _check_objects(args.old, old, args)
    _check_objects(args.new, new, args)
    filters, described = _filters(args)
    if filters:
        old = old.filter_traces(filters)
        new = new.filter_traces(filters)
    with _Progress("comparing snapshots"):
        every = new.compare_to(old, args.key, cumulative=args.cumulative)
        new_size, new_count = _totals(new)
        old_size, old_count = _totals(old)
    # Unchanged entries tell nothing about growth; compare_to sorts them last anyway.
    diffs = [stat for stat in every if stat.size_diff or stat.count_diff]
    total = {
        "size": new_size,
        "size_diff": new_size - old_size,
        "count": new_count,
        "count_diff": new_count - old_count,
    }
    limit = _limit(args)
    if args.json:
        document = _report.diff_json(
            diffs,
            old=(args.old, old),
            new=(args.new, new),
            key_type=args.key,
            cumulative=args.cumulative,
            limit=limit,
            filters=described,
            total=total,
        )
        _write_json(document)
        return 0
    shown = diffs if limit is None else diffs[:limit]
    renderer = _renderer(_names(shown), args, sys.stdout)
    what = _report.KEY_SINGULAR[args.key] + (" (cumulative)" if args.cumulative else "")
    shown_count = len(diffs) if limit is None else min(limit, len(diffs))
    count = "All" if limit is None else f"Top {shown_count}"
    noun = "difference" if shown_count == 1 else "differences"
    title = f"{count} {noun} by {what}: {args.new} compared to {args.old}"
    lines = renderer.diff(
        diffs,
        key_type=args.key,
        cumulative=args.cumulative,
        limit=limit,
        total=total,
        title=title,
    )
    notes = [
        f"({name}: {note})"
        for name, snapshot in ((args.new, new), (args.old, old))
        if (note := _report.sampling_note(snapshot)) is not None
    ]
    lines[1:1] = notes
    _write_lines(lines)
    return 0


def _write_lines(lines: Sequence[str]) -> None:
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def _write_json(document: dict[str, Any]) -> None:
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- why


def _site_matches(report, filename: str, lineno: int) -> bool:
    """Whether a report's site is FILE:LINE, FILE a full path or a trailing part of one."""
    if report["lineno"] != lineno:
        return False
    name = report["filename"]
    return name == filename or name.endswith("/" + filename.lstrip("/"))


def _cmd_why(args: argparse.Namespace) -> int:
    snapshot = _load(args.file, args.allow_pickle)
    reports = snapshot._data.retention
    if reports is None:
        raise CommandError(
            f"{args.file} holds no retention reports: capture them with "
            "alloctrace.take_snapshot(retention=N) before dump(), or run with "
            "ALLOCTRACE_OBJECTS=1 for dumps at exit"
        )
    from alloctrace._retention import SiteRetention

    if args.line is None:
        chosen = list(reports)
    else:
        filename, sep, line = args.line.rpartition(":")
        if not sep or not filename or not line.isdigit():
            raise CommandError(
                f"--line expects FILE:LINE (like app.py:42), not {args.line!r}", USAGE_ERROR
            )
        chosen = [r for r in reports if _site_matches(r, filename, int(line))]
        if not chosen:
            captured = ", ".join(f"{r['filename']}:{r['lineno']}" for r in reports) or "none"
            raise CommandError(
                f"{args.file} has no retention report for {args.line} (captured for: {captured})"
            )
    sites = [SiteRetention(r) for r in chosen]
    for site in sites:
        if args.limit is not None:
            site.paths = site.paths[: args.limit]
    if args.json:
        _write_json({"file": args.file, "reports": [site._json() for site in sites]})
    else:
        text = "\n\n".join(str(site) for site in sites)
        if not args.full_paths:
            # As stats and diff do: files under the current directory, relative to it.
            text = text.replace(os.getcwd().rstrip("/") + "/", "")
        _write_lines(text.split("\n"))
    return 0


# --------------------------------------------------------------------------- export


EXPORT_FORMATS = ("pprof", "collapsed")


def _loaded_and_filtered(path: str, args: argparse.Namespace):
    snapshot = _load(path, args.allow_pickle)
    filters, _ = _filters(args)
    return snapshot.filter_traces(filters) if filters else snapshot


def _write_export(output: str, write) -> None:
    """Runs ``write(output)``, turning its failures into one-line errors."""
    try:
        with _Progress(f"writing {output}"):
            write(output)
    except OSError as exc:
        # The native message names the temporary file; the user named only the output.
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise CommandError(f"cannot write {output}: {reason}") from None
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def _cmd_export(args: argparse.Namespace) -> int:
    snapshot = _loaded_and_filtered(args.file, args)
    if args.format == "pprof":
        _write_export(args.output, snapshot.to_pprof)
    else:
        _write_export(args.output, snapshot.to_collapsed)
    return 0


def _cmd_flamegraph(args: argparse.Namespace) -> int:
    if (args.file is None) == (args.diff is None):
        raise CommandError(
            "give either one snapshot FILE or --diff OLD NEW (see 'alloctrace flamegraph --help')",
            USAGE_ERROR,
        )
    if args.diff is None:
        snapshot, base = _loaded_and_filtered(args.file, args), None
    else:
        base = _loaded_and_filtered(args.diff[0], args)
        snapshot = _loaded_and_filtered(args.diff[1], args)
    _write_export(
        args.output, lambda output: snapshot.to_flamegraph(output, title=args.title, base=base)
    )
    return 0


def _add_export_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="file to write")
    _add_filter_options(parser)
    _add_pickle_option(parser)


def _add_filter_options(parser: argparse.ArgumentParser) -> None:
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


def _add_pickle_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="also read tracemalloc.Snapshot.dump() files (pickles: only for trusted files)",
    )


# --------------------------------------------------------------------------- run

_RUN_VALUE_OPTIONS = {
    "-n",
    "--nframe",
    "-o",
    "--output",
    "--interval",
    "--sample-interval",
    "--sample-seed",
}
_RUN_FLAG_OPTIONS = {"-q", "--quiet", "-h", "--help"}


def _split_run_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``run`` arguments into our options and the program's command line.

    Our options come first; the program starts at ``-m MODULE`` or at the first argument that
    is not one of our options, and everything after it belongs to the program untouched (as
    with ``python`` itself), even arguments that look like our options.
    """
    ours: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            return ours, list(argv[index + 1 :])
        if arg in ("-m", "-c") or (arg[:2] in ("-m", "-c") and len(arg) > 2):
            return ours, list(argv[index:])
        name = arg.split("=", 1)[0]
        if name in _RUN_VALUE_OPTIONS:
            if "=" in arg:
                ours.append(arg)
                index += 1
            else:
                ours.extend(argv[index : index + 2])
                index += 2
            continue
        if arg.startswith("-n") and len(arg) > 2 or arg.startswith("-o") and len(arg) > 2:
            ours.append(arg)
            index += 1
            continue
        if arg in _RUN_FLAG_OPTIONS or (arg.startswith("-") and arg != "-"):
            # Unknown options are left to argparse, which reports them in one line.
            ours.append(arg)
            index += 1
            continue
        return ours, list(argv[index:])
    return ours, []


def _run_parser() -> _Parser:
    parser = _Parser(
        prog=f"{PROG} run",
        description="Run a Python program traced from its first line and write a snapshot at "
        "exit. The program's exit status, standard streams, sys.argv and __main__ are as "
        "without alloctrace.",
        usage=f"{PROG} run [-n NFRAME] [-o FILE] [--interval SECONDS] "
        "[--sample-interval BYTES [--sample-seed N]] [-q] "
        "(script.py | -m module | -c command) [args ...]",
    )
    parser.add_argument(
        "-n",
        "--nframe",
        type=_positive_int,
        default=1,
        metavar="NFRAME",
        help="frames kept per traceback (default: 1; 1 to 65535)",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="snapshot file; may contain {pid}, {time}, {n} (default: alloctrace-NAME.{pid}.snap)",
    )
    parser.add_argument(
        "--interval",
        metavar="SECONDS",
        help="also write numbered snapshots every SECONDS (see ALLOCTRACE_INTERVAL)",
    )
    parser.add_argument(
        "--sample-interval",
        metavar="BYTES",
        help="sampled tracing, one sample per BYTES allocated on average (e.g. 512KiB, 2MiB; "
        "0: exact, the default); figures are then estimates (see ALLOCTRACE_SAMPLE_INTERVAL)",
    )
    parser.add_argument(
        "--sample-seed",
        metavar="N",
        help="seed of the sampler, for reproducible runs (see ALLOCTRACE_SAMPLE_SEED)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no summary after the run")
    return parser


def _cmd_run(argv: Sequence[str]) -> int:
    ours, program = _split_run_args(argv)
    args = _run_parser().parse_args(ours)
    if not program or program in (["-m"], ["-c"]):
        raise CommandError(
            "nothing to run: give a script, -m MODULE or -c COMMAND (see 'alloctrace run --help')",
            USAGE_ERROR,
        )
    if not 1 <= args.nframe <= _startup.MAX_NFRAME:
        raise CommandError(
            f"argument -n/--nframe: expected 1 to {_startup.MAX_NFRAME}, not {args.nframe}",
            USAGE_ERROR,
        )
    if program[0] == "-m":
        name = program[1]
    elif program[0].startswith("-m"):
        name = program[0][2:]
    elif program[0].startswith("-c"):
        name = "c"
    else:
        name = os.path.basename(program[0])
    output = args.output or f"alloctrace-{name}.{{pid}}.snap"
    try:
        _startup.check_path_template(output, "-o/--output")
        if args.interval is not None:
            _startup.parse_interval(args.interval)
        if args.sample_interval is not None:
            _startup.parse_sample_interval(args.sample_interval, "--sample-interval")
        if args.sample_seed is not None:
            _startup.parse_sample_seed(args.sample_seed, "--sample-seed")
            if not _startup.parse_sample_interval(args.sample_interval or "0"):
                raise _startup.ConfigError("--sample-seed needs --sample-interval")
    except _startup.ConfigError as exc:
        raise CommandError(str(exc), USAGE_ERROR) from None
    if not program[0].startswith("-") and not os.path.exists(program[0]):
        # Checked here: python would report it too, but only after writing an empty snapshot.
        raise CommandError(f"cannot run {program[0]}: No such file or directory")
    # {time} is fixed here so that the runner knows the file name; {pid} and {n} are the child's.
    started = time.time()
    stamp = _startup.format_time(started)
    template = _fill_template(output, time=stamp, pid="{pid}", n="{n}")

    env = dict(os.environ)
    env[_startup.ENV_NFRAME] = str(args.nframe)
    env[_startup.ENV_DUMP] = os.path.abspath(template)
    if args.interval is not None:
        env[_startup.ENV_INTERVAL] = args.interval
    else:
        env.pop(_startup.ENV_INTERVAL, None)
    # Options win over inherited variables, and no option means exact tracing.
    for option, name in (
        (args.sample_interval, _startup.ENV_SAMPLE_INTERVAL),
        (args.sample_seed, _startup.ENV_SAMPLE_SEED),
    ):
        if option is not None:
            env[name] = option
        else:
            env.pop(name, None)
    command = [sys.executable, *program]

    status, pid = _spawn(command, env)
    path = _find_dump(template, pid, started)
    shown = path if path is None or os.path.isabs(output) else os.path.relpath(path)
    if path is None:
        how = f"signal {signal.Signals(-status).name}" if status < 0 else f"status {status}"
        sys.stderr.write(f"{PROG}: no snapshot was written (the program ended with {how})\n")
    elif not args.quiet:
        _summarise(shown)
    if status < 0:
        _die_like_child(-status)
    return status


def _fill_template(template: str, **values: str) -> str:
    """Replace some placeholders of a dump path, keeping the others and the escaped braces."""
    import string

    parts = []
    for literal, field, _, _ in string.Formatter().parse(template):
        parts.append(literal.replace("{", "{{").replace("}", "}}"))
        if field is not None:
            parts.append(values.get(field, "{" + field + "}"))
    return "".join(parts)


def _spawn(command: list[str], env: dict[str, str]) -> tuple[int, int]:
    """Run the program in the foreground; return its status (negative: killed by a signal)
    and its process id."""
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        raise CommandError(f"cannot start {command[0]}: {exc.strerror or exc}") from None

    def forward(signum, frame):
        try:
            child.send_signal(signum)
        except OSError:
            pass

    # Ctrl-C reaches the whole foreground process group, the program included: let the program
    # decide what it means and stay alive to summarise. Termination requests sent to us alone
    # are passed on.
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        previous[signum] = signal.signal(signum, forward)
    try:
        return child.wait(), child.pid
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _die_like_child(signum: int) -> NoReturn:
    """End with the signal that ended the program, so that our parent sees the same thing."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        signal.signal(signum, signal.SIG_DFL)
    except (OSError, ValueError):
        # SIGKILL and SIGSTOP cannot be caught, so they already have their default action.
        pass
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)


def _summarise(shown: str) -> None:
    """The top 10 lines of the program's exit snapshot, on stderr (stdout is the program's)."""
    try:
        snapshot = _load(shown)
        args = argparse.Namespace(
            key="lineno",
            cumulative=False,
            limit=DEFAULT_LIMIT,
            filters=[],
            full_paths=False,
            no_source=False,
        )
        lines = render_stats(shown, snapshot, args, sys.stderr)
    except CommandError as exc:
        sys.stderr.write(f"{PROG}: snapshot written to {shown} but unreadable: {exc}\n")
        return
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.write(f"{PROG}: snapshot written to {shown}; see '{PROG} stats {shown}'\n")
    sys.stderr.flush()


def _find_dump(template: str, pid: int, started: float) -> str | None:
    """The program's exit snapshot if this run wrote it; with ``{n}``, the last one written."""
    import glob
    import string

    pattern = []
    for literal, field, _, _ in string.Formatter().parse(template):
        pattern.append(glob.escape(literal))
        if field == "pid":
            pattern.append(str(pid))
        elif field is not None:
            pattern.append("*")
    newest = None
    newest_mtime = started - 1.0
    for candidate in glob.glob("".join(pattern)):
        try:
            mtime = os.stat(candidate).st_mtime
        except OSError:
            continue
        if mtime >= newest_mtime:
            newest, newest_mtime = candidate, mtime
    return newest


# --------------------------------------------------------------------------- parser


def _add_report_options(parser: argparse.ArgumentParser, full: bool = True) -> None:
    parser.add_argument(
        "--limit",
        type=_positive_int,
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
        _add_filter_options(parser)
        parser.add_argument("--json", action="store_true", help="versioned JSON on stdout")
    parser.add_argument(
        "--full-paths", action="store_true", help="show file names exactly as recorded"
    )
    parser.add_argument("--no-source", action="store_true", help="do not show source lines")
    _add_pickle_option(parser)
    parser.set_defaults(key="lineno", cumulative=False, filters=None, json=False, full_paths=False)


def build_parser() -> _Parser:
    parser = _Parser(
        prog=PROG,
        description="Trace Python memory allocations and read the snapshots.",
        epilog="Start-up variables: ALLOCTRACE=NFRAME, ALLOCTRACE_DUMP=PATH, "
        "ALLOCTRACE_INTERVAL=SECONDS, ALLOCTRACE_SAMPLE_INTERVAL=BYTES, "
        "ALLOCTRACE_SAMPLE_SEED=N (see the README).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    # Listed for --help only: main() hands "run" to its own parser, which leaves the program's
    # arguments alone.
    commands.add_parser("run", help="run a program traced and summarise the snapshot it leaves")

    stats = commands.add_parser("stats", help="top allocation sites of a snapshot")
    stats.add_argument("file", help="snapshot file")
    _add_report_options(stats)

    top = commands.add_parser("top", help="the top 10 lines of a snapshot (stats with defaults)")
    top.add_argument("file", help="snapshot file")
    _add_report_options(top, full=False)

    diff = commands.add_parser("diff", help="what grew and shrank between two snapshots")
    diff.add_argument("old", help="earlier snapshot file")
    diff.add_argument("new", help="later snapshot file")
    _add_report_options(diff)

    export = commands.add_parser(
        "export", help="write a snapshot as a pprof profile or as folded stacks"
    )
    export.add_argument("file", help="snapshot file")
    export.add_argument(
        "--format",
        required=True,
        choices=EXPORT_FORMATS,
        help="pprof: gzipped profile.proto (go tool pprof); collapsed: 'a;b;c bytes' lines",
    )
    _add_export_options(export)

    flamegraph = commands.add_parser(
        "flamegraph", help="draw live memory by stack as an SVG flamegraph, or its growth"
    )
    flamegraph.add_argument("file", nargs="?", help="snapshot file")
    flamegraph.add_argument(
        "--diff",
        nargs=2,
        metavar=("OLD", "NEW"),
        help="draw what grew from OLD to NEW instead (red grew, blue shrank)",
    )
    flamegraph.add_argument("--title", help="title at the top of the picture")
    _add_export_options(flamegraph)

    why = commands.add_parser(
        "why", help="why the objects of a line are alive (retention report captured in a dump)"
    )
    why.add_argument("file", help="snapshot file with retention reports")
    why.add_argument(
        "--line",
        metavar="FILE:LINE",
        help="the allocation site (FILE may be the end of the path); default: every report",
    )
    why.add_argument(
        "--limit", type=_positive_int, metavar="N", help="show at most N sample paths per site"
    )
    why.add_argument("--json", action="store_true", help="write the reports as JSON")
    why.add_argument(
        "--full-paths",
        action="store_true",
        help="show file names in full (default: relative to the current directory)",
    )
    _add_pickle_option(why)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``alloctrace`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "run":
            return _cmd_run(argv[1:])
        args = build_parser().parse_args(argv)
        if args.command is None:
            raise CommandError(
                "a command is required: run, stats, top, diff, export, flamegraph or why",
                USAGE_ERROR,
            )
        if args.command in ("stats", "top"):
            return _cmd_stats(args)
        if args.command == "export":
            return _cmd_export(args)
        if args.command == "flamegraph":
            return _cmd_flamegraph(args)
        if args.command == "why":
            return _cmd_why(args)
        return _cmd_diff(args)
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
