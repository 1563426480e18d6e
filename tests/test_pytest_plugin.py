"""The pytest plugin (alloctrace_pytest + alloctrace._pytest_plugin), run on generated test
files with pytester: markers, options, failure messages, baselines, xdist, threads, and tests
that use a tracer themselves."""

import json
import os
import sys
import textwrap

import pytest

from alloctrace._pytest_plugin import Tolerance, parse_limit

pytest_plugins = ["pytester"]

USAGE_ERROR = 4
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


@pytest.fixture
def run(pytester):
    """Runs pytest in-process on the files written by the test; -p no:cacheprovider keeps
    the generated tree clean."""

    def run(*args):
        return pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)

    return run


def source(text):
    return textwrap.dedent(text).lstrip("\n")


def lineno(text, marker):
    return next(n for n, line in enumerate(text.splitlines(), 1) if f"# {marker}" in line)


def test_off_unless_asked_for(pytester):
    # In a child: nothing of alloctrace is imported, nothing traced.
    pytester.makepyfile(
        source(
            """
            import sys, tracemalloc

            def test_nothing_loaded():
                assert "alloctrace" not in sys.modules
                assert "alloctrace._native" not in sys.modules
                tracemalloc.start()
                assert tracemalloc.is_tracing()
                tracemalloc.stop()
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    # The plugin is registered all the same: its options and markers are there.
    result = pytester.runpytest_subprocess("--markers")
    result.stdout.fnmatch_lines(["*limit_memory(limit)*", "*limit_leaks(limit*"])


LIMITS = """
    import pytest

    def allocate(n):
        return [bytes(1000) for _ in range(n)]  # the big line

    KEPT = []

    @pytest.mark.limit_memory("1 MB")
    def test_over():
        KEPT.append(allocate(3000))  # the test's line

    @pytest.mark.limit_memory("10 MB")
    def test_under():
        kept = allocate(3000)
        assert kept

    @pytest.mark.limit_memory(2_000_000)
    def test_transient_peak():
        for _ in range(3):
            allocate(3000)  # 3 MB at the peak, nothing alive at the end

    def test_unmarked():
        allocate(5000)
    """


@pytest.fixture
def limits(pytester):
    pytester.makepyfile(test_limit_memory=source(LIMITS))


def test_limit_memory_outcomes(limits, run):
    result = run()
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    # The limit, the peak (3,000 blocks of ~1 KiB), the line holding them at the peak.
    # Named as stats names files: relative to the directory pytest runs in.
    big = f"\n  test_limit_memory.py:{lineno(source(LIMITS), 'the big line')}: size="
    assert "limit_memory: the test was limited to 1.0 MiB but its body allocated 3." in out
    assert "top lines at the peak (" in out
    over = out[out.index("limited to 1.0 MiB") : out.index("limited to 1.9 MiB")]
    assert big in over and "count=300" in over
    # A body that freed everything still shows what it held at its peak.
    assert "limit_memory: the test was limited to 1.9 MiB" in out
    transient = out[out.index("limited to 1.9 MiB") :]
    assert big in transient and "count=300" in transient


def test_verbosity_sets_the_detail(limits, run):
    quiet = run("-q", "-k", "over").stdout.str()
    assert "limited to 1.0 MiB" in quiet and "top lines" not in quiet
    default = run("-k", "over").stdout.str()
    big = lineno(source(LIMITS), "the big line")
    assert f"test_limit_memory.py:{big}:" in default and 'File "' not in default
    very = run("-vv", "-k", "over").stdout.str()
    # -vv: each line with its traceback, the test's own line among the frames.
    own = lineno(source(LIMITS), "the test's line")
    assert 'File "' in very and f'test_limit_memory.py", line {own}' in very


def test_default_limit_option(limits, run):
    result = run("--alloctrace-limit=1MB")
    # test_unmarked (5 MB) now fails too; test_under keeps its own 10 MB marker.
    result.assert_outcomes(passed=1, failed=3)
    assert "--alloctrace-limit: the test was limited to 1.0 MiB" in result.stdout.str()


@pytest.mark.parametrize(
    "marker, shown",
    [
        ('limit_memory("24 XB")', "limit_memory('24 XB')"),
        ("limit_memory(-5)", "limit_memory(-5)"),
        ("limit_memory()", "limit_memory(None)"),
        ('limit_leaks("lots")', "limit_leaks('lots')"),
        ('limit_leaks("1 MB", runs=0)', "limit_leaks(runs=0)"),
        ('limit_leaks("1 MB", filter=3)', "limit_leaks(filter=3)"),
    ],
)
def test_malformed_markers_stop_collection(pytester, run, marker, shown):
    pytester.makepyfile(
        test_bad=f"import pytest\n\n@pytest.mark.{marker}\ndef test_it():\n    pass\n"
    )
    result = run()
    assert result.ret == USAGE_ERROR
    errors = [line for line in result.stderr.lines if "test_bad.py::test_it" in line]
    assert len(errors) == 1 and shown in errors[0], result.stderr.lines


@pytest.mark.parametrize(
    "option, shown",
    [
        ("--alloctrace-limit=big", "--alloctrace-limit='big'"),
        ("--alloctrace-top=-1", "--alloctrace-top='-1'"),
        ("--alloctrace-tolerance=ten", "--alloctrace-tolerance='ten'"),
    ],
)
def test_malformed_options(pytester, run, option, shown):
    pytester.makepyfile("def test_it():\n    pass\n")
    result = run(option)
    assert result.ret == USAGE_ERROR
    assert shown in result.stderr.str()


LEAKS = """
    import pytest

    CACHE = {}
    STORE = []

    def cached(key):
        if key not in CACHE:
            CACHE[key] = [bytes(1000) for _ in range(2000)]  # cache line
        return CACHE[key]

    CALLS = []

    @pytest.mark.limit_leaks("100 KB", warmup=1, runs=3)
    def test_cache_filled_once():
        CALLS.append(1)
        assert len(cached("k")) == 2000

    @pytest.mark.limit_leaks("100 KB")
    def test_leaks():
        STORE.append({f"entry-{i}": bytes(500) for i in range(1000)})  # leak line

    @pytest.mark.limit_leaks("100 KB")
    def test_no_leak():
        temp = [bytes(1000) for _ in range(5000)]
        assert temp

    def test_counted_runs():
        assert len(CALLS) == 4  # 1 warm-up + 3 counted
    """


def test_limit_leaks(pytester, run):
    pytester.makepyfile(test_leaky=source(LEAKS))
    result = run()
    result.assert_outcomes(passed=3, failed=1)
    out = result.stdout.str()
    assert "test_leaky.py::test_leaks FAILED" in run("-v").stdout.str()
    assert "limit_leaks: 1 allocation site leaked more than 100.0 KiB per run" in out
    assert "(3 runs counted after 1 warm-up run)" in out
    leak_line = lineno(source(LEAKS), "leak line")
    assert f"\n  test_leaky.py:{leak_line}: " in out
    # The object kinds at the leaking line (the bytes values, the str keys, the dicts' key
    # tables), and who holds them.
    kinds = next(line for line in result.stdout.lines if "kinds: " in line)
    assert "bytes" in kinds and "str" in kinds, kinds
    assert "held by: test_leaky.STORE" in out


def test_limit_leaks_filter_drops_sites(pytester, run):
    pytester.makepyfile(
        test_filtered=source(
            """
            import pytest
            import alloctrace
            STORE = []

            @pytest.mark.limit_leaks("10 KB", filter=lambda stat: False)
            def test_callable():
                STORE.append([bytes(500) for i in range(1000)])

            @pytest.mark.limit_leaks("10 KB", filter=[alloctrace.Filter(False, __file__)])
            def test_filters():
                STORE.append([bytes(500) for i in range(1000)])

            @pytest.mark.limit_leaks("10 KB", filter=lambda stat: stat.size > 0)
            def test_kept():
                STORE.append([bytes(500) for i in range(1000)])
            """
        )
    )
    result = run()
    result.assert_outcomes(passed=2, failed=1)
    assert "test_kept" in result.stdout.str()


SESSION = """
    import pytest

    @pytest.mark.parametrize("n", [1, 2, 3, 4])
    def test_sizes(n):
        kept = [bytes(1000) for _ in range(n * 1000)]
        assert kept
    """


def test_top_table(pytester, run):
    pytester.makepyfile(test_session=source(SESSION))
    result = run("--alloctrace-top=2")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "*alloctrace: 2 highest peaks of 4 tests measured*",
            "*MiB  test_session.py::test_sizes[[]4[]]",
            "*MiB  test_session.py::test_sizes[[]3[]]",
        ]
    )


def test_xdist_workers_merge_into_one_table(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(test_session=source(SESSION))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", "--alloctrace-top=4"
    )
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*alloctrace: 4 highest peaks of 4 tests measured*"])
    for n in (1, 2, 3, 4):
        result.stdout.fnmatch_lines([f"*  test_session.py::test_sizes[[]{n}[]]"])
    # Both workers ran tests (xdist sends the first tests to each worker).
    result.stdout.fnmatch_lines(["combined peak of 2 xdist workers: at most *iB (the sum of *"])


def test_xdist_limits_fail_in_workers(limits, pytester):
    pytest.importorskip("xdist")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=2, failed=2)
    assert "limited to 1.0 MiB" in result.stdout.str()


def test_baseline_round_trip(pytester, run):
    pytester.makepyfile(test_session=source(SESSION))
    baseline = pytester.path / "peaks.json"
    run(f"--alloctrace-save-baseline={baseline}").assert_outcomes(passed=4)
    document = json.loads(baseline.read_text())
    assert document["format"] == "alloctrace-pytest-baseline" and document["version"] == 1
    assert len(document["peaks"]) == 4
    run(f"--alloctrace-baseline={baseline}").assert_outcomes(passed=4)
    # One test now allocates twice as much: it alone fails, naming the baseline.
    pytester.makepyfile(
        test_session=source(SESSION).replace("n * 1000", "n * (2000 if n == 2 else 1000)")
    )
    result = run(f"--alloctrace-baseline={baseline}")
    result.assert_outcomes(passed=3, failed=1)
    out = result.stdout.str()
    assert "test_sizes[2]" in out and "alloctrace baseline: peak" in out
    assert "(+100%)" in out and "tolerance 10% + 64.0 KiB" in out
    # A generous tolerance lets it pass.
    run(f"--alloctrace-baseline={baseline}", "--alloctrace-tolerance=150%").assert_outcomes(
        passed=4
    )


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        ("{not json", "is not a baseline file"),
        ('{"format": "something-else", "version": 1, "peaks": {}}', "is not a baseline file"),
        (
            '{"format": "alloctrace-pytest-baseline", "version": 99, "peaks": {}}',
            "has format version 99",
        ),
        ('{"format": "alloctrace-pytest-baseline", "version": 1, "peaks": {"t": -1}}', "malformed"),
    ],
)
def test_bad_baseline_is_a_usage_error(pytester, run, content, message):
    pytester.makepyfile("def test_it():\n    pass\n")
    path = pytester.path / "peaks.json"
    if content is not None:
        path.write_text(content)
    result = run(f"--alloctrace-baseline={path}")
    assert result.ret == USAGE_ERROR
    assert message in result.stderr.str() and str(path) in result.stderr.str()


def test_threads_started_by_the_test_are_measured(pytester, run):
    pytester.makepyfile(
        test_threads=source(
            """
            import threading, time, pytest

            KEPT = []

            @pytest.mark.limit_memory("1 MB")
            def test_thread_allocates():
                t = threading.Thread(target=lambda: KEPT.append([bytes(1000) for _ in range(3000)]))
                t.start()
                t.join()

            def test_outliving_thread():
                # Still allocating after its test ended: must not disturb the next tests.
                stop = threading.Event()
                def churn():
                    while not stop.is_set():
                        [bytes(100) for _ in range(100)]
                threading.Thread(target=churn, daemon=True).start()
                KEPT.append(stop)

            @pytest.mark.limit_memory("10 MB")
            def test_after():
                KEPT[-1].set()
            """
        )
    )
    result = run("--alloctrace")
    result.assert_outcomes(passed=2, failed=1)
    assert "test_thread_allocates" in result.stdout.str()
    assert "limited to 1.0 MiB" in result.stdout.str()


def test_tests_that_use_a_tracer_themselves(pytester, run):
    pytester.makepyfile(
        test_tracers=source(
            """
            import tracemalloc, pytest
            import alloctrace

            def test_tracemalloc_works():
                tracemalloc.start()
                kept = [bytes(1000) for _ in range(100)]
                assert tracemalloc.get_traced_memory()[0] > 100_000
                tracemalloc.stop()

            def test_alloctrace_works():
                alloctrace.start(5)
                kept = [bytes(1000) for _ in range(100)]
                assert alloctrace.get_traceback_limit() == 5
                assert alloctrace.get_traced_memory()[0] > 100_000
                alloctrace.stop()

            @pytest.mark.limit_memory("50 KB")
            def test_marked_uses_tracemalloc():
                tracemalloc.start()
                kept = [bytes(1000) for _ in range(100)]
                assert tracemalloc.get_traced_memory()[0] > 100_000
                tracemalloc.stop()

            @pytest.mark.limit_memory("10 MB")
            def test_marked_uses_alloctrace():
                alloctrace.start()
                alloctrace.stop()

            def test_plain():
                pass
            """
        )
    )
    result = run("--alloctrace-top=5")
    # The tests' own tracing works as without the plugin. A test that starts tracemalloc is
    # measured all the same (its 100 KB break the 50 KB limit); one that starts alloctrace
    # cannot be checked, and says so instead of passing.
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    assert "limit_memory: the test was limited to 50.0 KiB but its body allocated" in out
    assert "limit_memory: the test was not measured: the test called alloctrace.start()" in out
    assert "not measured (2):" in out
    assert "test_tracers.py::test_alloctrace_works: the test called alloctrace.start()" in out
    assert "3 highest peaks of 3 tests measured" in out


@pytest.mark.parametrize("how", ["conftest", "PYTHONTRACEMALLOC"])
def test_measured_while_tracemalloc_already_traces(pytester, monkeypatch, how):
    # `python -X tracemalloc -m pytest` (or PYTHONTRACEMALLOC), for the allocation tracebacks
    # of ResourceWarnings: alloctrace starts alongside tracemalloc for each test, and a
    # marked test is measured as without it.
    pytester.makepyfile(
        source(
            """
            import tracemalloc
            import pytest

            @pytest.mark.limit_memory("50 KB")
            def test_over_its_limit():
                assert tracemalloc.is_tracing()
                kept = [str(i) * 10 for i in range(20_000)]

            @pytest.mark.limit_memory("1 MB")
            def test_within_its_limit():
                kept = [str(i) for i in range(1000)]

            def test_tracemalloc_still_traces():
                assert tracemalloc.is_tracing()
                kept = [bytes(1000) for i in range(100)]
                assert tracemalloc.get_traced_memory()[0] > 100_000
            """
        )
    )
    if how == "conftest":
        pytester.makeconftest("import tracemalloc\ntracemalloc.start()\n")
    else:
        monkeypatch.setenv("PYTHONTRACEMALLOC", "5")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    assert "not measured" not in out, out
    assert "limit_memory: the test was limited to 50.0 KiB but its body allocated" in out, out


LEAKY = """
    import gc, socket

    def make():
        return socket.socket()

    def test_warning():
        s = make()
        del s

    def test_unraisable():
        class Cycle:
            def __del__(self):
                raise ValueError("in __del__")
        c = make_cycle(Cycle)
        del c
        gc.collect()

    def make_cycle(cls):
        c = cls()
        c.me = c
        return c
"""


def allocated_at(output):
    """The "Object allocated at:" blocks of a pytest run's output, as lists of lines."""
    blocks, lines = [], output.splitlines()
    for n, line in enumerate(lines):
        if line.strip() == "Object allocated at:":
            block = []
            for follow in lines[n + 1 :]:
                if not follow.startswith("  "):
                    break
                block.append(follow)
            blocks.append(block)
    return blocks


def test_reports_say_where_an_object_was_allocated(pytester):
    # pytest asks tracemalloc where a warning's object (and an unraisable exception's) was
    # allocated; under -X alloctrace it must get the same answer from alloctrace.
    path = pytester.makepyfile(source(LEAKY))
    seen = {}
    for tracer in ("tracemalloc", "alloctrace"):
        result = pytester.run(
            sys.executable,
            f"-X{tracer}=3",
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-W",
            "always::ResourceWarning",
            "-W",
            "always::pytest.PytestUnraisableExceptionWarning",
            str(path),
        )
        assert result.ret == 0, result.stdout.str()
        seen[tracer] = allocated_at(result.stdout.str())
    assert len(seen["tracemalloc"]) == 2, seen
    assert seen["alloctrace"] == seen["tracemalloc"]
    # Each block ends in the test file's own frames (the socket's block where the warning's
    # record resurrected it, re-attributed there under both tracers, as CPython asks).
    for block in seen["alloctrace"]:
        assert any(f'{path.name}", line ' in line for line in block), block


# --------------------------------------------------------------------------- pure logic


@pytest.mark.parametrize(
    "value, expected",
    [
        ("24 MB", 24 << 20),
        ("512KiB", 512 << 10),
        ("1.5 GB", 3 << 29),
        (1000, 1000),
        ("1000", 1000),
        ("24 XB", None),
        (-1, None),
        (True, None),
        (None, None),
        (2.5, None),
    ],
)
def test_parse_limit(value, expected):
    assert parse_limit(value) == expected


@pytest.mark.parametrize(
    "text, relative, absolute",
    [("10%", 0.1, 0), ("10%+64KiB", 0.1, 64 << 10), ("1MiB", 0.0, 1 << 20), ("0%", 0.0, 0)],
)
def test_tolerance_parse(text, relative, absolute):
    assert Tolerance.parse(text) == Tolerance(relative, absolute)


@pytest.mark.parametrize("text", ["", "ten", "10", "-5%", "10%+", "%"])
def test_tolerance_rejects(text):
    if text == "10":
        # A bare number is a size in bytes.
        assert Tolerance.parse(text) == Tolerance(0.0, 10)
        return
    with pytest.raises(ValueError, match="--alloctrace-tolerance"):
        Tolerance.parse(text)


def test_default_tolerance_holds_against_recorded_noise():
    """Peaks of toolz's test suite recorded in separate runs (tests/data/pytest_noise.json,
    see its "how" field): the default tolerance passes every run against every other, and a
    zero tolerance would not (so the noise is real and the check could fail)."""
    from alloctrace._pytest_plugin import DEFAULT_TOLERANCE

    with open(os.path.join(DATA, "pytest_noise.json")) as f:
        runs = json.load(f)["runs"]
    assert len(runs) >= 4
    default, zero = Tolerance.parse(DEFAULT_TOLERANCE), Tolerance(0.0, 0)
    tests = set(runs[0])
    noisy = 0
    for base in runs:
        for other in runs:
            for test in tests:
                assert other[test] <= default.allowed(base[test]), (test, base[test], other[test])
                noisy += other[test] > zero.allowed(base[test])
    assert noisy > 0
    # A real regression (a doubled peak) of any test above 256 KiB is caught.
    large = [test for test in tests if runs[0][test] > 256 << 10]
    assert large
    for test in large:
        assert 2 * runs[0][test] > default.allowed(max(r[test] for r in runs))


def test_unittest_cases_are_measured(pytester, run):
    pytester.makepyfile(
        test_cases=source(
            """
            import unittest
            import pytest

            KEPT = []

            class Case(unittest.TestCase):
                @pytest.mark.limit_memory("1 MB")
                def test_big(self):
                    KEPT.append([bytes(1000) for _ in range(3000)])

                def test_small(self):
                    pass
            """
        )
    )
    result = run("--alloctrace-top=2")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "limit_memory: the test was limited to 1.0 MiB" in out
    assert "2 highest peaks of 2 tests measured" in out


def test_limit_leaks_refuses_unittest_cases(pytester, run):
    pytester.makepyfile(
        test_cases=source(
            """
            import unittest
            import pytest

            class Case(unittest.TestCase):
                @pytest.mark.limit_leaks("1 MB")
                def test_it(self):
                    pass
            """
        )
    )
    result = run()
    assert result.ret == USAGE_ERROR
    assert "test_cases.py::Case::test_it: limit_leaks needs a plain test function" in (
        result.stderr.str()
    )
