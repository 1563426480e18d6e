"""Snapshot files: round trips, attributes, atomic dumps, hostile files, pickle opt-in and
cross-interpreter loading."""

import os
import pickle
import struct
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path

import pytest

from alloctrace._native import SnapshotFormatError
from alloctrace._snapshot import Snapshot

RAW = [
    (0, 10, (("a.py", 2), ("b.py", 4)), 3),
    (0, 10, (("a.py", 2), ("b.py", 4)), 3),
    (1, 2, (("a.py", 5), ("b.py", 4)), 3),
    (2, 2**63, (("s\udcffé.py", 1),), 1),
    (3, 7, (("<unknown>", 0),)),
]


def dump_bytes(tmp_path, snapshot):
    path = tmp_path / "snap.atrace"
    snapshot.dump(path)
    return path.read_bytes()


def test_round_trip_with_attributes(tmp_path):
    s = Snapshot(RAW, 2)
    s.test_attr = "new"
    s.nested = {"a": [1, -2, 2**100, -(2**70), 1.5, None, True, b"\x00\xff", ("t", "\udcff")]}
    path = tmp_path / "snap.atrace"
    s.dump(str(path))
    s2 = Snapshot.load(path)
    assert s2.traces == s.traces
    assert s2.traces._traces == RAW
    assert s2.traceback_limit == 2
    assert s2.test_attr == "new"
    assert s2.nested == s.nested
    assert type(s2.nested["a"][-1]) is tuple
    assert s2.metadata == s.metadata
    # Everything a loaded snapshot answers is the same.
    assert s2.statistics("traceback") == s.statistics("traceback")


def test_dump_is_much_smaller_than_pickle(tmp_path):
    raw = [(0, 32 + i % 500, ((f"m{i % 300}.py", i % 1000),), 1) for i in range(20000)]
    ours = len(dump_bytes(tmp_path, Snapshot(raw, 1)))
    theirs = len(pickle.dumps(tracemalloc.Snapshot(raw, 1), pickle.HIGHEST_PROTOCOL))
    assert ours * 2 <= theirs, (ours, theirs)


@pytest.mark.parametrize(
    "value, type_name",
    [({1, 2}, "set"), (object(), "object"), ([1, [2, {"k": 1j}]], "complex")],
)
def test_unstorable_attribute_is_a_type_error_and_leaves_no_file(tmp_path, value, type_name):
    s = Snapshot(RAW, 2)
    s.bad = value
    path = tmp_path / "snap.atrace"
    with pytest.raises(TypeError, match=f"attribute 'bad'.*{type_name}"):
        s.dump(path)
    assert list(tmp_path.iterdir()) == []


def test_dict_with_non_str_keys_is_refused(tmp_path):
    s = Snapshot(RAW, 2)
    s.bad = {1: 2}
    with pytest.raises(TypeError, match="dict keys must be str"):
        s.dump(tmp_path / "x")


def test_failed_dump_keeps_the_previous_file(tmp_path):
    path = tmp_path / "snap.atrace"
    Snapshot(RAW, 2).dump(path)
    before = path.read_bytes()
    s = Snapshot(RAW[:1], 2)
    s.bad = {1, 2}
    with pytest.raises(TypeError):
        s.dump(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["snap.atrace"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into read-only directories")
def test_unwritable_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(PermissionError):
            Snapshot(RAW, 2).dump(ro / "snap.atrace")
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)


def test_failed_rename_removes_the_temporary_file(tmp_path):
    # The target is a directory: the temporary file is written, then the rename fails.
    (tmp_path / "target").mkdir()
    with pytest.raises(IsADirectoryError):
        Snapshot(RAW, 2).dump(tmp_path / "target")
    assert [p.name for p in tmp_path.iterdir()] == ["target"]
    assert list((tmp_path / "target").iterdir()) == []


def test_missing_directory_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        Snapshot(RAW, 2).dump(tmp_path / "missing" / "snap.atrace")
    assert list(tmp_path.iterdir()) == []


def test_load_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        Snapshot.load(tmp_path / "nope")


def write(tmp_path, data):
    path = tmp_path / "bad.atrace"
    path.write_bytes(data)
    return path


def reseal(data):
    """Recompute the trailing CRC-32 so that the decoder's structural checks are reached."""
    return data[:-4] + struct.pack("<I", zlib.crc32(data[:-4]))


def test_every_truncation_is_refused(tmp_path):
    data = dump_bytes(tmp_path, Snapshot(RAW[:2], 2))
    for n in range(len(data)):
        with pytest.raises(SnapshotFormatError):
            Snapshot.load(write(tmp_path, data[:n]))


def test_every_flipped_byte_is_refused(tmp_path):
    data = dump_bytes(tmp_path, Snapshot(RAW[:2], 2))
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x5A
        with pytest.raises(SnapshotFormatError):
            Snapshot.load(write(tmp_path, bytes(bad)))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: b"", "the file is empty"),
        (lambda d: b"GIF89a" + d[6:], "not an alloctrace snapshot"),
        (lambda d: d[:5], "truncated"),
        (lambda d: d[:40], "truncated"),
        (lambda d: d + b"junk", "trailing garbage"),
        (lambda d: d[:8] + struct.pack("<I", 99) + d[12:], "format version 99 is newer"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "checksum mismatch"),
        (lambda d: d[:16] + struct.pack("<Q", 2**62) + d[24:], "declares"),
    ],
)
def test_hostile_files(tmp_path, mutate, message):
    data = dump_bytes(tmp_path, Snapshot(RAW, 2))
    path = write(tmp_path, mutate(data))
    with pytest.raises(SnapshotFormatError, match=message) as info:
        Snapshot.load(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_resealed_file_with_out_of_range_id(tmp_path):
    s = Snapshot([(0, 1, (("a.py", 1),), 1)], 1)
    data = bytearray(dump_bytes(tmp_path, s))
    # the frames section is tag 3; its payload is (count=1, filename id, lineno)
    at = data.index(struct.pack("<IQ", 3, 3)) + 12
    data[at + 1] = 7
    with pytest.raises(SnapshotFormatError, match="refers to filename 7"):
        Snapshot.load(write(tmp_path, reseal(bytes(data))))


def test_tracemalloc_pickle_needs_opt_in(tmp_path):
    path = tmp_path / "tm.pickle"
    tm = tracemalloc.Snapshot(RAW, 2)
    tm.test_attr = "new"
    tm.dump(path)
    with pytest.raises(SnapshotFormatError, match="allow_pickle=True"):
        Snapshot.load(path)
    s = Snapshot.load(path, allow_pickle=True)
    assert s.traces._traces == RAW
    assert s.traceback_limit == 2
    assert s.test_attr == "new"
    # our own format still loads with the flag set
    ours = tmp_path / "ours"
    s.dump(ours)
    assert Snapshot.load(ours, allow_pickle=True).traces == s.traces


def test_pickle_of_our_snapshot_and_foreign_pickles(tmp_path):
    ours = Snapshot(RAW, 2)
    path = tmp_path / "ours.pickle"
    path.write_bytes(pickle.dumps(ours, pickle.HIGHEST_PROTOCOL))
    assert Snapshot.load(path, allow_pickle=True).traces == ours.traces
    path.write_bytes(pickle.dumps({"not": "a snapshot"}, pickle.HIGHEST_PROTOCOL))
    with pytest.raises(SnapshotFormatError, match="not of a tracemalloc.Snapshot"):
        Snapshot.load(path, allow_pickle=True)


class _EarlierPickle:
    """Pickles as alloctrace's snapshots did before they pickled as file-format bytes."""

    def __init__(self, raw, limit, state):
        self.args = (raw, limit, state)

    def __reduce__(self):
        raw, limit, state = self.args
        return (Snapshot, (raw, limit), state)


def test_pickles_of_earlier_versions_still_load():
    back = pickle.loads(pickle.dumps(_EarlierPickle(RAW, 2, {"note": 1})))
    assert type(back) is Snapshot
    assert back.traces._traces == RAW and back.traceback_limit == 2 and back.note == 1


def test_real_tracemalloc_dump_loads(tmp_path):
    path = tmp_path / "live.pickle"
    tracemalloc.start(3)
    try:
        data = [bytes(100) for _ in range(50)]
        tracemalloc.take_snapshot().dump(path)
    finally:
        tracemalloc.stop()
    ours = Snapshot.load(path, allow_pickle=True)
    theirs = tracemalloc.Snapshot.load(path)
    assert ours.traces._traces == theirs.traces._traces
    assert len(data) == 50


def other_interpreters():
    """Interpreters named in ALLOCTRACE_OTHER_PYTHONS (os.pathsep-separated) that can import
    alloctrace, other than this one."""
    found = []
    for exe in filter(None, os.environ.get("ALLOCTRACE_OTHER_PYTHONS", "").split(os.pathsep)):
        if Path(exe).resolve() == Path(sys.executable).resolve():
            continue
        probe = subprocess.run(
            [exe, "-c", "import alloctrace._snapshot, sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0:
            found.append(exe)
    return found


def test_cross_interpreter_load(tmp_path):
    others = other_interpreters()
    if not others:
        pytest.skip(
            "no other interpreter with alloctrace installed; set ALLOCTRACE_OTHER_PYTHONS "
            "to their paths to run this"
        )
    script = (
        "import sys\n"
        "from alloctrace._snapshot import Snapshot\n"
        "mode, path = sys.argv[1:]\n"
        "if mode == 'dump':\n"
        "    s = Snapshot([(0, 10, (('a.py', 2), ('é\\udcff.py', 4)), 3)], 2)\n"
        "    s.who = sys.version\n"
        "    s.dump(path)\n"
        "else:\n"
        "    s = Snapshot.load(path)\n"
        "    print(s.traces._traces, s.who)\n"
    )
    for exe in others:
        theirs = tmp_path / "theirs.atrace"
        subprocess.run([exe, "-c", script, "dump", str(theirs)], check=True)
        loaded = Snapshot.load(theirs)
        assert loaded.traces._traces == [(0, 10, (("a.py", 2), ("é\udcff.py", 4)), 3)]
        assert loaded.who != sys.version
        ours = tmp_path / "ours.atrace"
        s = Snapshot(RAW, 2)
        s.who = sys.version
        s.dump(ours)
        out = subprocess.run(
            [exe, "-c", script, "load", str(ours)], check=True, capture_output=True, text=True
        ).stdout
        assert repr(RAW) in out or str(RAW) in out


def test_dump_writes_through_special_files_and_symlinks(tmp_path):
    """A device or FIFO is written to, not replaced; a symlink keeps pointing at the file."""
    snapshot = Snapshot(RAW, 2)
    with pytest.raises(OSError) as excinfo:
        snapshot.dump("/dev/full")  # a device: written to (and full), never replaced
    assert excinfo.value.errno == 28  # ENOSPC
    assert not os.path.isfile("/dev/full")
    snapshot.dump("/dev/null")
    assert not os.path.isfile("/dev/null")

    real = tmp_path / "real.snap"
    snapshot.dump(real)
    link = tmp_path / "link.snap"
    link.symlink_to(real)
    Snapshot(RAW[:1], 2).dump(link)
    assert link.is_symlink()
    assert len(Snapshot.load(real).traces) == 1


DATA = Path(__file__).parent / "data"


def version_1_traces():
    """The traces of tests/data/format-version-1.alct, rebuilt: every size width (0 up to
    2**64 - 1), many domain runs, 3- and 4-tuples, a few hundred traceback ids."""
    sizes = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**24, 2**32 - 1, 2**32, 2**56, 2**63]
    sizes.append(2**64 - 1)
    raw = []
    for i in range(700):
        frames = tuple(
            (f"pkg/m{(i * 7 + k) % 13}.py", (i * 31 + k) % 400 + 1) for k in range(i % 4)
        )
        size = sizes[i % len(sizes)] if i % 3 else 8 + (i * 37) % 3000
        domain = 0 if i % 9 else (i // 9) % 4
        if i % 11 == 0:
            raw.append((domain, size, frames))
        else:
            raw.append((domain, size, frames, len(frames) + i % 3))
    return raw


def test_version_1_file_still_loads(tmp_path):
    """A file written by format version 1 (LEB128 traces section), loaded and written again in
    the current version (width-coded trace columns)."""
    loaded = Snapshot.load(DATA / "format-version-1.alct")
    assert loaded.traces._traces == version_1_traces()
    assert loaded.traceback_limit == 3
    assert loaded.note == "written by format version 1"
    assert loaded.traces == Snapshot(version_1_traces(), 3).traces
    data = dump_bytes(tmp_path, loaded)
    assert struct.unpack_from("<I", data, 8) == (2,)
    again = Snapshot.load(tmp_path / "snap.atrace")
    assert again.traces._traces == version_1_traces()
    assert again.note == loaded.note


def test_resealed_file_with_out_of_range_traceback_id(tmp_path):
    s = Snapshot([(0, 1, (("a.py", 1),), 1), (0, 2, (("b.py", 1),), 1)], 1)
    data = bytearray(dump_bytes(tmp_path, s))
    # The traces section is tag 8; its payload: count=2, 1 domain run (0, 2), the sizes
    # column (width code 0, 1, 2), the ids column (width code 0, 0, 1).
    at = data.index(struct.pack("<IQ", 8, 10)) + 12
    assert data[at : at + 10] == bytes([2, 1, 0, 2, 0, 1, 2, 0, 0, 1])
    data[at + 9] = 2
    with pytest.raises(SnapshotFormatError, match="trace 1 refers to traceback 2, but there are"):
        Snapshot.load(write(tmp_path, reseal(bytes(data))))


def test_newer_format_is_refused_by_name(tmp_path):
    data = dump_bytes(tmp_path, Snapshot(RAW, 2))
    future = data[:8] + struct.pack("<I", 3) + data[12:]
    with pytest.raises(SnapshotFormatError, match=r"format version 3 is newer .*version 2\)"):
        Snapshot.load(write(tmp_path, future))
