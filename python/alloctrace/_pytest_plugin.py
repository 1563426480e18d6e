"""The pytest plugin proper: memory limits, leak checks, peaks table and baselines.

Loaded by the entry module ``alloctrace_pytest`` only when a run asks for it (an
``--alloctrace*`` option, or a collected test with a ``limit_memory`` or ``limit_leaks``
marker); see docs/pytest.md for the user's view.

How a test is measured: tracing starts just before its body (the ``call`` phase, after its
fixtures are set up) and stops just after, so the table holds only what the body allocated
and the traced peak is the body's own high-water mark, exact (every allocation, not a
sample), whatever ran before it. Tests that are not measured run untraced. Threads started by
the body are traced while it runs (the hooks are process-wide).

A test that itself starts or stops ``alloctrace`` cannot share the tracer: the first such call
during the body makes the plugin step aside (its tracing stops, the call goes through as the
test meant it) and the test is reported as not measured; a marked test then fails saying so,
rather than passing an unchecked limit. A test that starts ``tracemalloc`` is measured as any
other: tracemalloc then traces alongside, and neither counts the other's tables.
"""

from __future__ import annotations

import gc
import inspect
import json
import os
import stat as _stat
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

from alloctrace import _native, _retention, _startup
from alloctrace._report import PathShortener, format_size
from alloctrace._snapshot import BaseFilter, Filter

BASELINE_FORMAT = "alloctrace-pytest-baseline"
BASELINE_VERSION = 1
DEFAULT_TOLERANCE = "10%+64KiB"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


# --------------------------------------------------------------------------- sizes and specs


def parse_limit(value) -> Optional[int]:
    """A limit as a number of bytes: an int, or a size string as ``ALLOCTRACE_SAMPLE_INTERVAL``
    takes it (``'24 MB'``, ``'512KiB'``, ``'1.5 GB'``; units binary). ``None`` if malformed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str):
        return _startup.parse_size(value)
    return None


#: The largest relative tolerance, as a fraction (100,000,000,000%).
MAX_RELATIVE = 1e9


@dataclass(frozen=True)
class Tolerance:
    """How much a test's peak may grow over its baseline: *relative* (a fraction) of the
    baseline plus *absolute* bytes. The absolute part covers the small tests whose peak moves
    by a dict resize or an interned string from run to run; the relative part, the larger ones
    whose peak scales with hash-ordered work."""

    relative: float
    absolute: int

    @classmethod
    def parse(cls, text: str) -> Tolerance:
        """``'10%'``, ``'10%+64KiB'``, ``'64KiB'``; a ``ValueError`` naming *text* otherwise."""
        relative, absolute = 0.0, 0
        for part in text.replace(" ", "").split("+"):
            if part.endswith("%"):
                try:
                    relative = float(part[:-1]) / 100
                except ValueError:
                    relative = -1
                # inf% (or 1e400%) would pass anything, and then overflow in allowed(); past
                # a billion times the baseline, no tolerance means anything more.
                if not 0 <= relative <= MAX_RELATIVE:
                    break
            else:
                size = _startup.parse_size(part) if part else None
                if size is None:
                    break
                absolute = size
        else:
            return cls(relative, absolute)
        raise ValueError(
            f"--alloctrace-tolerance={text!r}: expected a percentage and/or a size, "
            "like '10%', '10%+64KiB' or '1MiB'"
        )

    def allowed(self, baseline: int) -> int:
        """The highest peak that still passes against *baseline*."""
        return int(baseline * (1 + self.relative)) + self.absolute

    def __str__(self) -> str:
        return f"{self.relative * 100:g}% + {format_size(self.absolute)}"


@dataclass
class LeakSpec:
    limit: int
    warmup: int
    runs: int
    filter: Any


@dataclass
class TestSpec:
    """What is checked for one test; a test without a spec is not measured."""

    memory_limit: Optional[int] = None
    memory_from: str = ""
    leaks: Optional[LeakSpec] = None


@dataclass
class Measure:
    """One test body's measurement while it runs."""

    spec: TestSpec
    skipped_reason: Optional[str] = None
    stepped_aside: Optional[str] = None
    peak: int = 0
    leak_report: Optional[str] = None
    restore: list = field(default_factory=list)


def _marker_errors(item) -> tuple[Optional[TestSpec], list[str]]:
    """The spec of an item's markers, and one line per malformed argument."""
    errors = []
    spec = TestSpec()
    marker = item.get_closest_marker("limit_memory")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("limit")
        extra = set(marker.kwargs) - {"limit"}
        limit = parse_limit(value)
        if limit is None or len(marker.args) > 1 or extra:
            errors.append(
                f"{item.nodeid}: limit_memory({value!r}): expected one size, like '24 MB', "
                "'512 KiB' or 1000000"
            )
        spec.memory_limit, spec.memory_from = limit, "limit_memory"
    marker = item.get_closest_marker("limit_leaks")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("limit")
        limit = parse_limit(value)
        kwargs = dict(marker.kwargs)
        kwargs.pop("limit", None)
        warmup, runs, filt = (
            kwargs.pop("warmup", 1),
            kwargs.pop("runs", 3),
            kwargs.pop("filter", None),
        )
        if limit is None or len(marker.args) > 1:
            errors.append(
                f"{item.nodeid}: limit_leaks({value!r}): expected one size, like '1 MB', "
                "'512 KiB' or 1000000"
            )
        if kwargs:
            errors.append(f"{item.nodeid}: limit_leaks: unknown argument {sorted(kwargs)[0]!r}")
        for name, number, low in (("warmup", warmup, 0), ("runs", runs, 1)):
            if isinstance(number, bool) or not isinstance(number, int) or number < low:
                errors.append(
                    f"{item.nodeid}: limit_leaks({name}={number!r}): expected an int >= {low}"
                )
        if not (filt is None or callable(filt) or _is_filter_list(filt)):
            errors.append(
                f"{item.nodeid}: limit_leaks(filter={filt!r}): expected a callable taking a "
                "Statistic, or a list of alloctrace.Filter"
            )
        function = getattr(item, "obj", None)
        if function is None or inspect.iscoroutinefunction(function) or not _calls_pyfunc(item):
            errors.append(
                f"{item.nodeid}: limit_leaks needs a plain test function (it calls the body "
                "several times)"
            )
        spec.leaks = LeakSpec(limit or 0, warmup, runs, filt)
    if spec.memory_limit is None and spec.leaks is None:
        return None, errors
    return spec, errors


def _calls_pyfunc(item) -> bool:
    """Whether pytest runs *item* by calling its function through ``pytest_pyfunc_call``
    (plain test functions; not unittest or doctest items, which override ``runtest``)."""
    return isinstance(item, pytest.Function) and type(item).runtest is pytest.Function.runtest


def _is_filter_list(value) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(f, BaseFilter) for f in value)


# --------------------------------------------------------------------------- baselines


#: A baseline holds one short line per test: past this size a file is not one.
BASELINE_MAX_BYTES = 64 << 20


def _read_baseline(path: str) -> bytes:
    """The bytes of a baseline file, read only from a regular file (opened without blocking, so
    a FIFO or a device is refused rather than waited on or read for ever) and only up to
    :data:`BASELINE_MAX_BYTES`."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not _stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > BASELINE_MAX_BYTES:
            raise ValueError(f"larger than {BASELINE_MAX_BYTES >> 20} MiB")
        chunks = []
        left = BASELINE_MAX_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise ValueError(f"larger than {BASELINE_MAX_BYTES >> 20} MiB")
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_baseline(path: str) -> dict[str, int]:
    """The peaks recorded in a baseline file, by test id; a ``pytest.UsageError`` naming the
    file if it is missing, unreadable, or not a baseline of this format version."""
    try:
        document = json.loads(_read_baseline(path).decode("utf-8"))
    except FileNotFoundError:
        raise pytest.UsageError(
            f"--alloctrace-baseline: {path} does not exist (record one with "
            "--alloctrace-save-baseline)"
        ) from None
    except RecursionError:
        raise pytest.UsageError(
            f"--alloctrace-baseline: {path} is not a baseline file (too deeply nested)"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        # ValueError: malformed JSON, or a number of more digits than int() converts.
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise pytest.UsageError(
            f"--alloctrace-baseline: {path} is not a baseline file ({reason})"
        ) from None
    if not isinstance(document, dict) or document.get("format") != BASELINE_FORMAT:
        raise pytest.UsageError(f"--alloctrace-baseline: {path} is not a baseline file")
    if document.get("version") != BASELINE_VERSION:
        raise pytest.UsageError(
            f"--alloctrace-baseline: {path} has format version {document.get('version')!r}; "
            f"this alloctrace reads version {BASELINE_VERSION} (record it again with "
            "--alloctrace-save-baseline)"
        )
    peaks = document.get("peaks")
    if not isinstance(peaks, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**64
        for k, v in peaks.items()
    ):
        raise pytest.UsageError(f"--alloctrace-baseline: {path} has malformed peaks")
    return peaks


def check_save_path(path: str) -> None:
    """A ``pytest.UsageError`` now, before any test runs, for a baseline name that cannot be
    written: a baseline is read back, so it goes to a regular file only (never standard
    output, a device or a FIFO, which a rename would replace)."""
    from . import _output

    try:
        if _output.is_stdout(path):
            raise _output.OutputError(f"{path} is standard output, not a regular file")
        _output.check(path)
    except _output.OutputError as error:
        raise pytest.UsageError(f"--alloctrace-save-baseline: {error}") from None


def save_baseline(path: str, peaks: dict[str, int]) -> None:
    """Write *peaks* to *path* as :mod:`alloctrace._output` writes (a temporary file renamed
    over it, so a failed write leaves the previous baseline in place; mode 0600 unless
    ``ALLOCTRACE_FILE_MODE`` says otherwise; a link planted by another user replaced, not
    followed)."""
    from . import _output

    document = {
        "format": BASELINE_FORMAT,
        "version": BASELINE_VERSION,
        "peaks": dict(sorted(peaks.items())),
    }
    _output.write(path, (json.dumps(document, indent=1) + "\n").encode("utf-8"))


# --------------------------------------------------------------------------- the plugin


class SessionPlugin:
    """Per-session state: which tests are measured and how, and the peaks found."""

    def __init__(self, config):
        self.config = config
        self.all_tests = bool(
            config.getoption("alloctrace")
            or config.getoption("alloctrace_limit")
            or config.getoption("alloctrace_top")
            or config.getoption("alloctrace_baseline")
            or config.getoption("alloctrace_save_baseline")
        )
        self.default_limit = None
        limit = config.getoption("alloctrace_limit")
        if limit:
            self.default_limit = parse_limit(limit)
            if self.default_limit is None:
                raise pytest.UsageError(
                    f"--alloctrace-limit={limit!r}: expected a size, like '24 MB', '512 KiB' "
                    "or 1000000"
                )
        self.top = 0
        top = config.getoption("alloctrace_top")
        if top:
            if not (top.isdigit() and int(top) > 0):
                raise pytest.UsageError(
                    f"--alloctrace-top={top!r}: expected a number of tests (an int > 0)"
                )
            self.top = int(top)
        try:
            self.tolerance = Tolerance.parse(
                config.getoption("alloctrace_tolerance") or DEFAULT_TOLERANCE
            )
        except ValueError as error:
            raise pytest.UsageError(str(error)) from None
        baseline = config.getoption("alloctrace_baseline")
        self.baseline_path = baseline
        self.baseline = load_baseline(baseline) if baseline else None
        self.save_path = config.getoption("alloctrace_save_baseline")
        if self.save_path:
            check_save_path(self.save_path)
        self.verbosity = config.getoption("verbose")
        # Tracebacks for -vv; a single frame groups by line at the least cost otherwise.
        self.nframe = 16 if self.verbosity >= 2 else 1
        self.specs: dict[str, TestSpec] = {}
        self.peaks: dict[str, int] = {}
        self.unmeasured: dict[str, str] = {}
        # Under xdist, in the controller: each worker's highest test peak, by worker id.
        self.worker_peaks: dict[str, int] = {}

    # ---- collection

    def collected(self, items) -> None:
        """Work out each item's spec; malformed marker arguments stop the run, one line
        each naming the test and the value."""
        errors = []
        for item in items:
            spec, bad = _marker_errors(item)
            errors.extend(bad)
            if spec is None and self.all_tests:
                spec = TestSpec()
            if spec is not None and spec.memory_limit is None and self.default_limit is not None:
                spec.memory_limit, spec.memory_from = self.default_limit, "--alloctrace-limit"
            if spec is not None:
                self.specs[item.nodeid] = spec
        if errors:
            raise pytest.UsageError("\n".join(errors))

    # ---- running

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        # Items that call the test function through pytest_pyfunc_call are measured there,
        # closer to the body: pytest's own work in the call phase (its PYTEST_CURRENT_TEST
        # variable, output capture, warnings) stays out. Others (unittest, doctest) here.
        spec = self.specs.get(item.nodeid)
        if spec is None or _calls_pyfunc(item):
            return (yield)
        return (yield from self._measured(item, spec))

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem):
        spec = self.specs.get(pyfuncitem.nodeid)
        if spec is None:
            return (yield)
        return (yield from self._measured(pyfuncitem, spec))

    def _measured(self, item, spec: TestSpec):
        """The body of both wrappers: trace what the inner call does, then judge it."""
        measure = Measure(spec)
        self._begin(measure)
        try:
            if spec.leaks is not None and measure.skipped_reason is None:
                result = yield from self._leak_runs(item, measure)
            else:
                result = yield
        except BaseException:
            self._end(item, measure, passed=False)
            raise
        self._end(item, measure, passed=True)
        return result

    def _leak_runs(self, item, measure: Measure):
        """Calls the test function warmup + runs times: the warm-up calls directly, then
        pytest's own call (the first counted run), then the other counted runs."""
        leaks = measure.spec.leaks
        function = item.obj
        kwargs = {name: item.funcargs[name] for name in item._fixtureinfo.argnames}
        for _ in range(leaks.warmup):
            function(**kwargs)
        # Only what the counted runs allocate is traced from here: caches the warm-up runs
        # filled are not in the table.
        gc.collect()
        if measure.stepped_aside is None:
            _native.clear_traces()
        result = yield
        for _ in range(leaks.runs - 1):
            function(**kwargs)
        del kwargs
        gc.collect()
        if measure.stepped_aside is None and _native.is_tracing():
            measure.leak_report = _leak_report(leaks, self.verbosity)
        return result

    def _begin(self, measure: Measure) -> None:
        # The standard tracemalloc tracing already (`python -X tracemalloc -m pytest`, asked
        # for the allocation tracebacks of ResourceWarnings) is no obstacle: alloctrace then
        # traces alongside it.
        if _native.is_tracing():
            measure.skipped_reason = "alloctrace was already tracing when the test started"
            return
        self._guard(measure)
        _native.start(self.nframe)

    def _guard(self, measure: Measure) -> None:
        """Make the first call the test makes to start or stop alloctrace step the plugin
        aside: tracing stops (the measurement is void) and the call goes through. The
        standard tracemalloc needs no such guard: started while alloctrace traces, it traces
        alongside, and the measurement goes on."""
        import alloctrace

        def stepping_aside(module, name, original):
            def call(*args, **kwargs):
                if measure.stepped_aside is None:
                    measure.stepped_aside = f"the test called {module.__name__}.{name}()"
                    _native.stop()
                return original(*args, **kwargs)

            call.__doc__ = original.__doc__
            return call

        for name in ("start", "stop", "clear_traces", "reset_peak"):
            original = getattr(alloctrace, name)
            setattr(alloctrace, name, stepping_aside(alloctrace, name, original))
            measure.restore.append((alloctrace, name, original))

    def _end(self, item, measure: Measure, passed: bool) -> None:
        for module, name, original in reversed(measure.restore):
            setattr(module, name, original)
        spec = measure.spec
        reason = measure.skipped_reason or measure.stepped_aside
        if reason is not None:
            self.unmeasured[item.nodeid] = reason
            if passed and (spec.memory_limit is not None or spec.leaks is not None):
                what = spec.memory_from or "limit_leaks"
                pytest.fail(
                    f"{what}: the test was not measured: {reason} (alloctrace's plugin "
                    "needs the tracer to itself during the test body)",
                    pytrace=False,
                )
            return
        peak = _native.get_traced_memory()[1]
        over = spec.memory_limit is not None and peak > spec.memory_limit
        snapshot = _peak_snapshot() if passed and over else None
        _native.stop()
        self.peaks[item.nodeid] = peak
        if not passed:
            return
        if over:
            pytest.fail(self._limit_message(spec, peak, snapshot), pytrace=False)
        if measure.leak_report:
            pytest.fail(measure.leak_report, pytrace=False)
        if self.baseline is not None and item.nodeid in self.baseline:
            base = self.baseline[item.nodeid]
            if peak > self.tolerance.allowed(base):
                growth = f" (+{(peak - base) / base:.0%})" if base else ""
                pytest.fail(
                    f"alloctrace baseline: peak {format_size(peak)} grew past "
                    f"{format_size(base)}{growth} recorded in {self.baseline_path} "
                    f"(tolerance {self.tolerance})",
                    pytrace=False,
                )

    def _limit_message(self, spec: TestSpec, peak: int, snapshot) -> str:
        lines = [
            f"{spec.memory_from}: the test was limited to "
            f"{format_size(spec.memory_limit)} but its body allocated "
            f"{format_size(peak)} at its peak"
        ]
        if self.verbosity < 0 or snapshot is None:
            return "\n".join(lines)
        count = 5 if self.verbosity == 0 else 20
        stats = snapshot.statistics("traceback" if self.verbosity >= 2 else "lineno")
        if not stats:
            lines.append("no line of the test body held memory at its peak")
            return "\n".join(lines)
        lines.append(
            f"top lines at the peak ({format_size(sum(s.size for s in stats))} in all, "
            "less what pytest and alloctrace held):"
        )
        shorten = PathShortener(frame.filename for s in stats[:count] for frame in s.traceback)
        for stat in stats[:count]:
            # str(stat) as tracemalloc writes it, its location shortened as stats shortens it.
            frame = stat.traceback[0]
            rest = str(stat)[len(str(stat.traceback)) :]
            lines.append(f"  {shorten(frame.filename)}:{frame.lineno}{rest}")
            if self.verbosity >= 2:
                lines.extend(f"    {line}" for line in stat.traceback.format())
        if len(stats) > count:
            lines.append(f"  ... {len(stats) - count} more lines (-v shows more)")
        return "\n".join(lines)

    # ---- the session's end

    def pytest_sessionfinish(self, session):
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            # An xdist worker: the controller merges every worker's peaks.
            workeroutput["alloctrace"] = {
                "peaks": self.peaks,
                "unmeasured": self.unmeasured,
                "worker_peak": max(self.peaks.values(), default=0),
            }
            return
        if self.save_path:
            save_baseline(self.save_path, self.peaks)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        data = getattr(node, "workeroutput", {}).get("alloctrace")
        if data:
            self.peaks.update(data["peaks"])
            self.unmeasured.update(data["unmeasured"])
            worker = str(
                getattr(getattr(node, "gateway", None), "id", None) or len(self.worker_peaks)
            )
            self.worker_peaks[worker] = int(data.get("worker_peak", 0))

    def pytest_terminal_summary(self, terminalreporter):
        if getattr(self.config, "workeroutput", None) is not None:
            return
        if self.save_path:
            terminalreporter.write_line(
                f"alloctrace: {len(self.peaks)} peaks recorded in {self.save_path}"
            )
        if not self.top:
            return
        ranked = sorted(self.peaks.items(), key=lambda kv: (-kv[1], kv[0]))[: self.top]
        terminalreporter.write_sep(
            "=",
            f"alloctrace: {len(ranked)} highest peaks of {len(self.peaks)} tests measured",
        )
        width = max((len(format_size(p)) for _, p in ranked), default=0)
        for nodeid, peak in ranked:
            terminalreporter.write_line(f"{format_size(peak):>{width}}  {nodeid}")
        if len(self.worker_peaks) > 1:
            combined = sum(self.worker_peaks.values())
            terminalreporter.write_line(
                f"combined peak of {len(self.worker_peaks)} xdist workers: at most "
                f"{format_size(combined)} (the sum of each worker's highest test peak, an upper "
                "bound: the workers ran at once, their highest tests not necessarily together)"
            )
        if self.unmeasured:
            terminalreporter.write_line(f"not measured ({len(self.unmeasured)}):")
            for nodeid, reason in sorted(self.unmeasured.items()):
                terminalreporter.write_line(f"  {nodeid}: {reason}")


# --------------------------------------------------------------------------- reports


def _alive_snapshot():
    """What the test body allocated and still holds (see :func:`_without_harness`)."""
    import alloctrace

    return _without_harness(alloctrace.take_snapshot())


def _peak_snapshot():
    """What was alive, per traceback, when the test body's traced memory peaked (see
    :func:`_without_harness`)."""
    import alloctrace

    return _without_harness(alloctrace.take_snapshot(peak=True))


def _without_harness(snapshot):
    """*snapshot* less what pytest, pluggy and alloctrace themselves allocated around the test
    body (by the most recent frame)."""
    import _pytest
    import pluggy

    dirs = [_PACKAGE_DIR] + [
        os.path.dirname(os.path.abspath(m.__file__)) for m in (_pytest, pluggy)
    ]
    return snapshot.filter_traces([Filter(False, os.path.join(d, "*")) for d in dirs])


def _leak_report(spec: LeakSpec, verbosity: int) -> Optional[str]:
    """The failure text of a limit_leaks test, or ``None`` if no site leaked past the limit.

    Leaked memory per site is what the counted runs allocated there and is still alive,
    divided by the number of runs. Only for the sites over the limit are object kinds (a
    walk of the heap) and retention paths (another) captured, so a passing test pays for
    neither."""
    import alloctrace

    snapshot = _alive_snapshot()
    if _is_filter_list(spec.filter):
        snapshot = snapshot.filter_traces(list(spec.filter))
    stats = [s for s in snapshot.statistics("lineno") if s.size / spec.runs > spec.limit]
    if callable(spec.filter):
        stats = [s for s in stats if spec.filter(s)]
    if not stats:
        return None
    sites = [(s.traceback[-1].filename, s.traceback[-1].lineno) for s in stats]
    kinds_snapshot = alloctrace.take_snapshot(objects=True)
    kinds: dict[tuple, list] = {}
    for stat in kinds_snapshot.statistics("lineno+type"):
        frame = stat.traceback[-1]
        kinds.setdefault((frame.filename, frame.lineno), []).append(stat)
    reports = {(r["filename"], r["lineno"]): r for r in _retention.capture_sites(sites, limit=1)}
    runs = "run" if spec.runs == 1 else f"{spec.runs} runs"
    lines = [
        f"limit_leaks: {len(stats)} allocation site{'s' if len(stats) > 1 else ''} leaked "
        f"more than {format_size(spec.limit)} per run ({runs} counted after "
        f"{spec.warmup} warm-up run{'s' if spec.warmup != 1 else ''}):"
    ]
    shown = stats if verbosity >= 1 else stats[:10]
    shorten = PathShortener(site[0] for site in sites[: len(shown)])
    for stat, site in zip(shown, sites):
        lines.append(
            f"  {shorten(site[0])}:{site[1]}: {format_size(stat.size / spec.runs)} per run "
            f"({format_size(stat.size)} in {stat.count:,} blocks still alive)"
        )
        site_kinds = sorted(kinds.get(site, []), key=lambda s: -s.size)
        if site_kinds:
            lines.append(
                "    kinds: " + ", ".join(f"{s.kind} {format_size(s.size)}" for s in site_kinds[:4])
            )
        report = reports.get(site)
        if report is not None and report["paths"]:
            lines.append(f"    held by: {report['paths'][0]}")
        elif report is not None and report["unreachable"]:
            lines.append("    held by: nothing reachable (a reference cycle awaiting collection)")
        if verbosity >= 2:
            lines.extend(f"      {line}" for line in stat.traceback.format())
    if len(stats) > len(shown):
        lines.append(f"  ... {len(stats) - len(shown)} more sites (-v shows them all)")
    return "\n".join(lines)
