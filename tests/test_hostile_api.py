"""Every public function of alloctrace given bad input: wrong types, negative, zero and huge
values, missing, closed or unwritable paths, corrupt files. Each gets a specific exception
whose message names the problem, never a crash, a hang or a silent wrong answer.

Table-driven: each case is (id, call, expected exception type, regex its message matches).
"""

import os

import pytest

import alloctrace

HUGE = 2**70


pytestmark = pytest.mark.usefixtures("stopped_tracer")


@pytest.fixture(scope="module")
def snapshot():
    alloctrace.start(2)
    try:
        data = [bytes(100 + i) for i in range(10)]  # noqa: F841  (traced content)
        return alloctrace.take_snapshot()
    finally:
        alloctrace.stop()


@pytest.fixture
def files(tmp_path, snapshot):
    """Paths of good and bad snapshot files."""
    good = tmp_path / "good.snap"
    snapshot.dump(good)
    data = good.read_bytes()
    paths = {"good": good, "dir": tmp_path, "missing": tmp_path / "missing.snap"}
    for name, content in {
        "empty": b"",
        "garbage": b"this is not a snapshot at all",
        "truncated": data[: len(data) // 2],
        "flipped": data[:20] + bytes([data[20] ^ 0x40]) + data[21:],
        "trailing": data + b"junk",
        "magic_only": data[:8],
        "future": data[:8] + (999).to_bytes(4, "little") + data[12:],
        "pickle": b"\x80\x04\x95\x00\x00",
    }.items():
        path = tmp_path / f"{name}.snap"
        path.write_bytes(content)
        paths[name] = path
    paths["under_a_file"] = good / "x.snap"  # a regular file as a directory: ENOTDIR
    paths["fifo"] = tmp_path / "fifo.snap"  # no writer: must not block
    os.mkfifo(paths["fifo"])
    paths["dev_zero"] = "/dev/zero"  # endless: must not be read
    sparse = paths["sparse"] = tmp_path / "sparse.snap"  # 4 GiB claimed, none on disk
    with open(sparse, "wb") as f:
        f.truncate(4 << 30)
    return paths


RANGE = r"number of frames must be in range \[1; 65535\]"

TRACER_CASES = [
    ("start-str", lambda: alloctrace.start("3"), TypeError, "str"),
    ("start-float", lambda: alloctrace.start(2.5), TypeError, "float"),
    ("start-none", lambda: alloctrace.start(None), TypeError, "NoneType"),
    ("start-zero", lambda: alloctrace.start(0), ValueError, RANGE + ", got 0"),
    ("start-negative", lambda: alloctrace.start(-1), ValueError, RANGE + ", got -1"),
    ("start-too-big", lambda: alloctrace.start(65536), ValueError, RANGE + ", got 65536"),
    ("start-huge", lambda: alloctrace.start(HUGE), ValueError, RANGE + f", got {HUGE}"),
    ("start-huge-neg", lambda: alloctrace.start(-HUGE), ValueError, RANGE + f", got -{HUGE}"),
    ("start-extra-arg", lambda: alloctrace.start(1, 2), TypeError, "argument"),
    ("stop-arg", lambda: alloctrace.stop(1), TypeError, "argument"),
    ("limit-str", lambda: alloctrace.set_traceback_limit("3"), TypeError, "str"),
    ("limit-zero", lambda: alloctrace.set_traceback_limit(0), ValueError, RANGE),
    ("limit-negative", lambda: alloctrace.set_traceback_limit(-5), ValueError, RANGE),
    ("limit-huge", lambda: alloctrace.set_traceback_limit(HUGE), ValueError, RANGE),
    ("object-tb-no-arg", lambda: alloctrace.get_object_traceback(), TypeError, "obj"),
    (
        "snapshot-not-tracing",
        lambda: alloctrace.take_snapshot(),
        RuntimeError,
        "must be tracing memory allocations",
    ),
    ("traced-memory-arg", lambda: alloctrace.get_traced_memory(1), TypeError, "argument"),
]


@pytest.mark.parametrize(
    "call, error, message", [c[1:] for c in TRACER_CASES], ids=[c[0] for c in TRACER_CASES]
)
def test_tracer_functions_reject_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()
    # A refused call leaves the tracer as it was.
    assert not alloctrace.is_tracing()
    assert alloctrace.get_traceback_limit() >= 1


def test_refused_limit_keeps_the_old_one_while_tracing():
    alloctrace.start(7)
    for bad in (0, -1, 65536, HUGE):
        with pytest.raises(ValueError):
            alloctrace.set_traceback_limit(bad)
    assert alloctrace.get_traceback_limit() == 7
    assert alloctrace.is_tracing()


NOT_A_SNAPSHOT = "is not a readable alloctrace snapshot"

LOAD_CASES = [
    ("missing", FileNotFoundError, "missing.snap"),
    ("dir", IsADirectoryError, "Is a directory"),
    ("empty", alloctrace.SnapshotFormatError, NOT_A_SNAPSHOT + ": the file is empty"),
    ("garbage", alloctrace.SnapshotFormatError, "bad magic number"),
    ("truncated", alloctrace.SnapshotFormatError, "truncated"),
    ("flipped", alloctrace.SnapshotFormatError, NOT_A_SNAPSHOT),
    ("trailing", alloctrace.SnapshotFormatError, "trailing"),
    ("magic_only", alloctrace.SnapshotFormatError, "truncated"),
    ("future", alloctrace.SnapshotFormatError, "format version 999 is newer"),
    ("pickle", alloctrace.SnapshotFormatError, "allow_pickle=True"),
    ("under_a_file", NotADirectoryError, "Not a directory"),
    ("fifo", alloctrace.SnapshotFormatError, "it is a FIFO, not a regular file"),
    ("dev_zero", alloctrace.SnapshotFormatError, "a character device, not a regular file"),
    ("sparse", alloctrace.SnapshotFormatError, "bad magic number"),
]


@pytest.mark.parametrize("name, error, message", LOAD_CASES, ids=[c[0] for c in LOAD_CASES])
def test_load_rejects_bad_files(files, name, error, message):
    with pytest.raises(error, match=message) as info:
        alloctrace.Snapshot.load(files[name])
    if issubclass(error, alloctrace.SnapshotFormatError):
        # A format error is a ValueError naming the file.
        assert isinstance(info.value, ValueError)
        assert str(files[name]) in str(info.value)
    else:
        assert info.value.errno is not None


@pytest.mark.parametrize(
    "path, error, message",
    [
        (None, TypeError, "NoneType"),
        (42, TypeError, "int"),
        ("nul\0byte", (ValueError, OSError), "NUL|null"),
    ],
    ids=["none", "int", "nul"],
)
def test_load_rejects_bad_path_types(path, error, message):
    with pytest.raises(error, match=message):
        alloctrace.Snapshot.load(path)


def test_load_accepts_bytes_paths(files):
    alloctrace.Snapshot.load(os.fsencode(files["good"]))


def test_dump_to_unwritable_places(files, snapshot, tmp_path):
    cases = [
        (files["under_a_file"], NotADirectoryError),
        (tmp_path / "no" / "such" / "dir.snap", FileNotFoundError),
        (tmp_path, IsADirectoryError),
    ]
    for path, error in cases:
        with pytest.raises(error) as info:
            snapshot.dump(path)
        assert info.value.errno is not None
    # The good file is still intact after all that.
    assert len(alloctrace.Snapshot.load(files["good"]).traces) == len(snapshot.traces)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_dump_into_read_only_directory(snapshot, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(PermissionError):
            snapshot.dump(ro / "x.snap")
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("path, error", [(None, TypeError), (3, TypeError)], ids=["none", "int"])
def test_dump_rejects_bad_path_types(snapshot, path, error):
    with pytest.raises(error):
        snapshot.dump(path)


def test_dump_rejects_unstorable_attribute(snapshot, tmp_path):
    snapshot.unstorable = object()
    try:
        with pytest.raises(TypeError, match="cannot store snapshot attribute 'unstorable'"):
            snapshot.dump(tmp_path / "x.snap")
    finally:
        del snapshot.unstorable
    assert not (tmp_path / "x.snap").exists()


ANALYSIS_CASES = [
    ("statistics-bad-key", lambda s: s.statistics("nope"), ValueError, "unknown key_type"),
    ("statistics-int-key", lambda s: s.statistics(3), ValueError, "unknown key_type"),
    ("compare-bad-key", lambda s: s.compare_to(s, "bad"), ValueError, "unknown key_type"),
    ("filter-none", lambda s: s.filter_traces(None), TypeError, "filters must be a list"),
    (
        "filter-lineno-str",
        lambda s: s.filter_traces([alloctrace.Filter(True, "*", lineno="x")]),
        TypeError,
        "lineno must be an int",
    ),
    (
        "filter-lineno-negative",
        lambda s: s.filter_traces([alloctrace.Filter(True, "*", lineno=-1)]),
        ValueError,
        "lineno is out of range: -1",
    ),
    (
        "filter-domain-huge",
        lambda s: s.filter_traces([alloctrace.Filter(True, "*", domain=HUGE)]),
        ValueError,
        "domain is out of range",
    ),
    (
        "domain-filter-str",
        lambda s: s.filter_traces([alloctrace.DomainFilter(True, "x")]),
        TypeError,
        "domain must be an int",
    ),
    (
        "domain-filter-negative",
        lambda s: s.filter_traces([alloctrace.DomainFilter(True, -1)]),
        ValueError,
        "domain is out of range: -1",
    ),
    ("filter-pattern-none", lambda s: alloctrace.Filter(True, None), TypeError, "NoneType"),
    ("filter-pattern-int", lambda s: alloctrace.Filter(True, 5), TypeError, "int"),
    (
        "snapshot-short-trace",
        lambda s: alloctrace.Snapshot([(0,)], 1),
        ValueError,
        r"traces\[0\] must be \(domain, size, frames\)",
    ),
    (
        "snapshot-traces-none",
        lambda s: alloctrace.Snapshot(None, 1),
        TypeError,
        "traces must be a sequence",
    ),
    (
        "snapshot-negative-size",
        lambda s: alloctrace.Snapshot([(0, -5, (("a", 1),))], 1),
        ValueError,
        r"traces\[0\] size is out of range: -5",
    ),
    (
        "snapshot-huge-size",
        lambda s: alloctrace.Snapshot([(0, HUGE, (("a", 1),))], 1),
        ValueError,
        r"traces\[0\] size is out of range",
    ),
    (
        "snapshot-limit-negative",
        lambda s: alloctrace.Snapshot([], -1),
        ValueError,
        "traceback_limit is out of range: -1",
    ),
    (
        "snapshot-limit-str",
        lambda s: alloctrace.Snapshot([], "x"),
        TypeError,
        "traceback_limit must be an int",
    ),
]


@pytest.mark.parametrize(
    "call, error, message", [c[1:] for c in ANALYSIS_CASES], ids=[c[0] for c in ANALYSIS_CASES]
)
def test_analysis_rejects_bad_arguments(snapshot, call, error, message):
    with pytest.raises(error, match=message):
        call(snapshot)


WRONG_OBJECT_TYPES = [
    ("filter-list-of-int", lambda s: s.filter_traces([1])),
    ("filter-str", lambda s: s.filter_traces("abc")),
    ("compare-to-none", lambda s: s.compare_to(None, "lineno")),
]


@pytest.mark.parametrize(
    "call", [c[1] for c in WRONG_OBJECT_TYPES], ids=[c[0] for c in WRONG_OBJECT_TYPES]
)
def test_analysis_rejects_wrong_object_types_with_type_error(snapshot, call):
    with pytest.raises(TypeError, match="must be a"):
        call(snapshot)
