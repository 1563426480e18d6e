"""The snapshot value types and analyses, checked against the standard tracemalloc.

Snapshots are built from raw trace tuples as CPython's own tests build them; every analysis
is compared with what :mod:`tracemalloc` answers for the same traces, including the order of
rows, on hand-written and on randomly generated snapshots.
"""

import pickle
import random
import tracemalloc

import pytest

from alloctrace._snapshot import (
    BaseFilter,
    DomainFilter,
    Filter,
    Frame,
    Snapshot,
    Statistic,
    StatisticDiff,
    Trace,
    Traceback,
)

RAW = [
    (0, 10, (("a.py", 2), ("b.py", 4)), 3),
    (0, 10, (("a.py", 2), ("b.py", 4)), 3),
    (0, 10, (("a.py", 2), ("b.py", 4)), 3),
    (1, 2, (("a.py", 5), ("b.py", 4)), 3),
    (2, 66, (("b.py", 1),), 1),
    (3, 7, (("<unknown>", 0),), 1),
]
RAW2 = [
    (0, 10, (("a.py", 2), ("b.py", 4)), 3),
    (0, 10, (("a.py", 2), ("b.py", 4)), 3),
    (0, 10, (("a.py", 2), ("b.py", 4)), 3),
    (2, 2, (("a.py", 5), ("b.py", 4)), 3),
    (2, 5000, (("a.py", 5), ("b.py", 4)), 3),
    (4, 400, (("c.py", 578),), 1),
]


def as_text(rows):
    """Rows of either implementation as comparable plain text (class names aside)."""
    return [repr(row).split(" ", 1)[1] for row in rows]


def random_raw(rng, n):
    names = ["a.py", "b.py", "c/d.py", "é.py", "z\udcff.py", "<unknown>", "x.pyc"]
    frames_pool = [(rng.choice(names), rng.randrange(0, 6)) for _ in range(12)]
    tracebacks = []
    for _ in range(15):
        depth = rng.randrange(1, 4)
        tracebacks.append(tuple(rng.choice(frames_pool) for _ in range(depth)))
    return [
        (rng.randrange(0, 3), rng.choice([1, 2, 8, 8, 100]), tb, len(tb) + rng.randrange(0, 2))
        for tb in (rng.choice(tracebacks) for _ in range(n))
    ]


def test_traces_sequence():
    s = Snapshot(RAW, 2)
    assert len(s.traces) == 6
    assert s.traceback_limit == 2
    assert s.traces._traces == RAW
    assert s.traces[0] == Trace(RAW[0])
    assert s.traces[-1] == Trace(RAW[-1])
    assert s.traces[1:3] == (Trace(RAW[1]), Trace(RAW[2]))
    assert list(s.traces) == [Trace(t) for t in RAW]
    assert Trace(RAW[3]) in s.traces
    assert s.traces == Snapshot(RAW, 2).traces
    assert s.traces != Snapshot(RAW[:-1], 2).traces
    assert repr(s.traces) == "<Traces len=6>"
    with pytest.raises(IndexError):
        s.traces[6]
    # identical tracebacks share one frames tuple, as _get_traces() gives them
    raw = s.traces._traces
    assert raw[0][2] is raw[1][2]


def test_traces_from_a_generator_of_fresh_objects():
    # Fresh tuples and strings per item: freed objects' addresses must not alias cached ones.
    def gen():
        for i in range(2000):
            yield (0, i, ((f"f{i % 7}_{i}.py"[: 4 + i % 3], i), ("x" + str(i), 1)), 2)

    expected = list(gen())
    assert Snapshot(gen(), 2).traces._traces == expected


def test_three_tuples_have_no_total_nframe():
    s = Snapshot([(0, 5, (("a.py", 1),))], 1)
    assert s.traces._traces == [(0, 5, (("a.py", 1),))]
    assert s.traces[0].traceback.total_nframe is None


@pytest.mark.parametrize(
    "raw, message",
    [
        ([(0, 1)], r"traces\[0\] must be \(domain, size, frames\)"),
        ([(0, 1, (("a", 1),)), (-1, 1, ())], r"traces\[1\] domain is out of range"),
        ([(0, "x", ())], r"traces\[0\] size must be an int"),
        ([(0, 1, (("a", 1, 2),))], r"traces\[0\] frame 0 must be \(filename, lineno\)"),
        ([(0, 1, ((b"a", 1),))], r"traces\[0\] frame 0: filename must be a str"),
        ([7], r"traces\[0\] must be a tuple"),
        (5, "traces must be a sequence"),
    ],
)
def test_bad_raw_traces(raw, message):
    with pytest.raises((TypeError, ValueError), match=message):
        Snapshot(raw, 1)


def test_value_types_match_tracemalloc():
    frames = (("b.py", 2), ("a.py", 1))
    ours, theirs = Traceback(frames, 5), tracemalloc.Traceback(frames, 5)
    assert repr(ours) == repr(theirs)
    assert str(ours) == str(theirs)
    assert hash(ours) == hash(theirs)
    assert repr(Traceback(())) == "<Traceback ()>"
    assert Traceback(frames) == Traceback(frames, 9)
    assert Traceback((("a.py", 1),)) < Traceback((("a.py", 2),))
    assert Frame(("a.py", 1)) < Frame(("a.py", 2)) < Frame(("b.py", 0))
    assert Frame(("a.py", 1)) in ours
    assert ours[0] == Frame(("a.py", 1))
    trace = (0, 12345678, frames, 2)
    assert repr(Trace(trace)).replace("Trace ", "") == repr(tracemalloc.Trace(trace)).replace(
        "Trace ", ""
    )
    assert str(Trace(trace)) == str(tracemalloc.Trace(trace))
    for size, count in [(0, 0), (66, 1), (5002, 2), (10**7, 3), (-3 * 2**40, 1)]:
        assert str(Statistic(ours, size, count)) == str(tracemalloc.Statistic(theirs, size, count))
        diff = (ours, size, -size // 3, count, -count)
        their_diff = (theirs, size, -size // 3, count, -count)
        assert str(StatisticDiff(*diff)) == str(tracemalloc.StatisticDiff(*their_diff))
        assert (
            repr(StatisticDiff(*diff)).split(" ", 1)[1]
            == repr(tracemalloc.StatisticDiff(*their_diff)).split(" ", 1)[1]
        )
    assert Statistic(ours, 1, 1) == Statistic(Traceback(frames), 1, 1)
    assert len({Statistic(ours, 1, 1), Statistic(Traceback(frames), 1, 1)}) == 1


@pytest.mark.parametrize(
    "key_type, cumulative",
    [
        ("traceback", False),
        ("lineno", False),
        ("filename", False),
        ("lineno", True),
        ("filename", True),
    ],
)
@pytest.mark.parametrize("seed", range(8))
def test_statistics_and_diff_equal_tracemalloc(key_type, cumulative, seed):
    rng = random.Random(seed)
    raw_old, raw_new = random_raw(rng, 300), random_raw(rng, 300)
    ours_old, ours_new = Snapshot(raw_old, 3), Snapshot(raw_new, 3)
    theirs_old = tracemalloc.Snapshot(raw_old, 3)
    theirs_new = tracemalloc.Snapshot(raw_new, 3)
    assert as_text(ours_new.statistics(key_type, cumulative)) == as_text(
        theirs_new.statistics(key_type, cumulative)
    )
    assert as_text(ours_new.compare_to(ours_old, key_type, cumulative)) == as_text(
        theirs_new.compare_to(theirs_old, key_type, cumulative)
    )
    # a tracemalloc snapshot is accepted as the old one
    assert as_text(ours_new.compare_to(theirs_old, key_type, cumulative)) == as_text(
        theirs_new.compare_to(theirs_old, key_type, cumulative)
    )


def test_statistics_errors():
    s = Snapshot(RAW, 2)
    with pytest.raises(ValueError, match="unknown key_type: 'bogus'"):
        s.statistics("bogus")
    with pytest.raises(ValueError, match="unknown key_type: 3"):
        s.statistics(3)
    with pytest.raises(
        ValueError, match="cumulative mode cannot by used with key type 'traceback'"
    ):
        s.statistics("traceback", cumulative=True)
    with pytest.raises(ValueError):
        s.compare_to(s, "traceback", True)


def filters_for(rng):
    patterns = ["a.py", "*.py", "b*", "?.py", "[ab].py", "[!a]*", "x.py", "é*", "*\udcff*", ""]
    out = []
    for _ in range(rng.randrange(0, 4)):
        if rng.random() < 0.25:
            out.append(("domain", rng.random() < 0.5, rng.randrange(0, 3)))
        else:
            out.append(
                (
                    "filename",
                    rng.random() < 0.5,
                    rng.choice(patterns),
                    rng.choice([None, 0, 1, 2]),
                    rng.random() < 0.5,
                    rng.choice([None, 0, 1]),
                )
            )
    return out


def build_filters(module, specs):
    filters = []
    for spec in specs:
        if spec[0] == "domain":
            filters.append(module.DomainFilter(spec[1], spec[2]))
        else:
            _, inclusive, pattern, lineno, all_frames, domain = spec
            filters.append(module.Filter(inclusive, pattern, lineno, all_frames, domain))
    return filters


class ModuleOfOurs:
    Filter = Filter
    DomainFilter = DomainFilter


@pytest.mark.parametrize("seed", range(40))
def test_filter_traces_equal_tracemalloc(seed):
    rng = random.Random(seed)
    raw = random_raw(rng, 200)
    specs = filters_for(rng)
    ours = Snapshot(raw, 3).filter_traces(build_filters(ModuleOfOurs, specs))
    theirs = tracemalloc.Snapshot(raw, 3).filter_traces(build_filters(tracemalloc, specs))
    assert ours.traces._traces == theirs.traces._traces, specs


def test_filter_traces_arguments():
    s = Snapshot(RAW, 2)
    with pytest.raises(TypeError, match="filters must be a list of filters, not Filter"):
        s.filter_traces(Filter(True, "a.py"))
    copy = s.filter_traces(())
    assert copy is not s and copy.traces == s.traces
    assert Filter(True, "a.pyc").filename_pattern == "a.py"


def test_user_defined_filter_runs_in_python():
    class SizeFilter(BaseFilter):
        def _match(self, trace):
            return trace[1] > 9

    s = Snapshot(RAW, 2).filter_traces([SizeFilter(True), Filter(False, "b.py")])
    assert [t.size for t in s.traces] == [10, 10, 10]


@pytest.mark.parametrize(
    "pattern, name",
    [
        ("[a-c]?.py", "bé.py"),
        ("[!é]x", "éx"),
        ("[!é]x", "ex"),
        ("a\\b", "a\\b"),
        ("{a,b}.py", "{a,b}.py"),
        ("*\udcff", "x\udcff"),
        ("?", "\udcff"),
        ("[z-a]", "m"),
    ],
)
def test_filter_pattern_edge_cases_equal_fnmatch(pattern, name):
    import fnmatch
    import sys

    if pattern == "[z-a]" and sys.version_info < (3, 10):
        pytest.skip("fnmatch of Python 3.9 raises re.error for a reversed range")
    assert Filter(True, pattern)._match_frame(name, 0) == fnmatch.fnmatch(name, pattern)


def test_metadata_of_hand_built_snapshot():
    assert Snapshot(RAW, 2).metadata == {
        "python_version": None,
        "timestamp": None,
        "pid": None,
        "argv": [],
    }


def test_snapshot_pickles():
    s = Snapshot(RAW, 2)
    s.note = "kept"
    s2 = pickle.loads(pickle.dumps(s))
    assert s2.traces == s.traces and s2.note == "kept" and s2.traceback_limit == 2


def test_traceback_format_uses_linecache(monkeypatch):
    import linecache

    monkeypatch.setattr(linecache, "getline", lambda name, line: f"  <{name} {line}>  ")
    tb = Snapshot(RAW, 2).traces[0].traceback
    assert tb.format(limit=1, most_recent_first=True) == ['  File "a.py", line 2', "    <a.py 2>"]
    assert tb.format() == tracemalloc.Traceback(RAW[0][2]).format()


@pytest.mark.parametrize("seed", range(5))
def test_random_patterns_equal_fnmatch(seed):
    """The Rust matcher (globset plus its exact fallback) answers as fnmatch does."""
    import fnmatch

    from alloctrace._native import fnmatch_filename

    rng = random.Random(seed)
    pattern_alphabet = [
        "a",
        "b",
        "/",
        "*",
        "?",
        "[",
        "]",
        "!",
        "-",
        "^",
        "\\",
        "{",
        ",",
        "é",
        "\udcff",
    ]
    name_alphabet = ["a", "b", "/", "-", "!", "^", "]", "\\", "{", "é", "\udcff", "z"]
    checked = 0
    for _ in range(3000):
        pattern = "".join(rng.choice(pattern_alphabet) for _ in range(rng.randrange(0, 7)))
        name = "".join(rng.choice(name_alphabet) for _ in range(rng.randrange(0, 6)))
        try:
            expected = fnmatch.fnmatchcase(name, pattern)
        except Exception:  # Python 3.9 raises re.error for reversed ranges
            continue
        assert fnmatch_filename(name, pattern) == expected, (pattern, name)
        checked += 1
    assert checked > 2000
