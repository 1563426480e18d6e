"""The process's resident memory beside the traced total: get_process_memory(), the figures a
snapshot records at capture time (file section 13), and hostile section-13 payloads."""

import mmap
import pickle
import struct
import tracemalloc
import zlib

import pytest

import alloctrace
from alloctrace import ProcessMemory, Snapshot, SnapshotFormatError, _report

TAG = 13


def test_get_process_memory_matches_the_kernel_split():
    pm = alloctrace.get_process_memory()
    assert isinstance(pm, ProcessMemory)
    assert pm.rss > 0 and pm.peak_rss >= pm.rss
    # The kernel's VmRSS is RssAnon + RssFile + RssShmem (read at one moment).
    assert pm.anon + pm.file + pm.shmem == pm.rss
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    assert abs(int(status["VmHWM"].split()[0]) * 1024 - pm.peak_rss) < 64 << 20


def test_anonymous_and_shared_memory_show_in_their_parts():
    before = alloctrace.get_process_memory()
    anon = mmap.mmap(-1, 64 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    shared = mmap.mmap(-1, 32 << 20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    for m in (anon, shared):
        m.write(b"x" * len(m))  # touch every page: untraced, but resident
    after = alloctrace.get_process_memory()
    assert after.anon - before.anon >= 60 << 20
    assert after.shmem - before.shmem >= 30 << 20
    assert after.rss - before.rss >= 90 << 20
    anon.close()
    shared.close()


@pytest.fixture
def live_snapshot(stopped_tracer):
    alloctrace.start(1)
    held = bytearray(1000)  # a block for the snapshot to hold, whatever else runs
    snapshot = alloctrace.take_snapshot()
    alloctrace.stop()
    del held
    return snapshot


def test_snapshot_records_figures_at_capture(live_snapshot, tmp_path):
    pm = live_snapshot.process_memory
    assert isinstance(pm, ProcessMemory) and pm.rss > 0
    assert pm.anon + pm.file + pm.shmem == pm.rss
    path = tmp_path / "s.atrace"
    live_snapshot.dump(path)
    assert Snapshot.load(path).process_memory == pm
    assert live_snapshot.filter_traces([alloctrace.DomainFilter(True, 0)]).process_memory == pm


def test_snapshots_without_figures_say_none(tmp_path):
    assert Snapshot([(0, 1, (("a.py", 1),), 1)], 1).process_memory is None
    path = tmp_path / "tm.pickle"
    tracemalloc.Snapshot([(0, 1, (("a.py", 1),), 1)], 1).dump(path)
    assert Snapshot.load(path, allow_pickle=True).process_memory is None
    path.write_bytes(pickle.dumps(Snapshot([(0, 1, (("a.py", 1),), 1)], 1)))
    assert Snapshot.load(path, allow_pickle=True).process_memory is None


def test_pickles_keep_what_load_keeps(live_snapshot, tmp_path):
    alloctrace.start(1)
    try:
        peak = alloctrace.take_snapshot(peak=True)
    finally:
        alloctrace.stop()
    snapshot = live_snapshot._with_peak(peak)
    snapshot.note = {"any": {1, 2}}  # a pickle holds what a dump could not
    pm = snapshot.process_memory
    assert pm is not None
    back = pickle.loads(pickle.dumps(snapshot))
    assert back.process_memory == pm
    assert back.metadata == snapshot.metadata and back.metadata["pid"] is not None
    assert back.traces == snapshot.traces and back.note == {"any": {1, 2}}
    assert back.peak is not None and back.peak._data == peak._data
    assert back.statistics("traceback") == snapshot.statistics("traceback")
    path = tmp_path / "ours.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    assert Snapshot.load(path, allow_pickle=True).process_memory == pm


def sections(data):
    """(offset of the tag, tag, payload length) of each section."""
    pos, out = 12, []
    while pos < len(data):
        tag, length = struct.unpack_from("<IQ", data, pos)
        out.append((pos, tag, length))
        pos += 12 + length
    return out


def uleb(*values):
    out = bytearray()
    for v in values:
        while True:
            byte = v & 0x7F
            v >>= 7
            out.append(byte | (0x80 if v else 0))
            if not v:
                break
    return bytes(out)


def with_payload(data, payload=None, tag=TAG):
    """The file with section 13's payload replaced (or its tag changed), CRC recomputed."""
    ((pos, _, length),) = [s for s in sections(data) if s[1] == TAG]
    if payload is None:
        payload = data[pos + 12 : pos + 12 + length]
    new = data[:pos] + struct.pack("<IQ", tag, len(payload)) + payload
    new += data[pos + 12 + length :]
    return new[:-4] + struct.pack("<I", zlib.crc32(new[:-4]))


@pytest.fixture
def dumped(live_snapshot, tmp_path):
    path = tmp_path / "s.atrace"
    live_snapshot.dump(path)
    return path.read_bytes()


def load(tmp_path, data):
    path = tmp_path / "bad.atrace"
    path.write_bytes(data)
    return Snapshot.load(path)


def test_older_readers_skip_the_section_and_newer_fields_are_skipped(dumped, tmp_path):
    # An unknown tag is what a reader from before section 13 sees: it loads, without figures.
    assert load(tmp_path, with_payload(dumped, tag=250)).process_memory is None
    # A newer writer's extra fields are ignored.
    pm = load(tmp_path, with_payload(dumped, uleb(7, 10, 4, 3, 2, 20, 99, 98))).process_memory
    assert pm == ProcessMemory(rss=10, anon=4, file=3, shmem=2, peak_rss=20)


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"", "process memory section"),
        (uleb(4, 10, 4, 3, 2), "holds 4 fields, fewer than the 5"),
        (uleb(5, 10, 4, 3), "process memory section"),
        (uleb(5, 10, 4, 3, 2, 20, 1), "unexpected bytes"),
        (uleb(5, 10, 8, 3, 2, 20), "exceed the RSS of 10 bytes"),
        (uleb(5, 10, 2**64 - 1, 3, 0, 20), "exceed the RSS"),
        (uleb(5) + b"\xff" * 11, "oversized number"),
        (uleb(2**64 - 1, 1, 1, 1, 1, 1), "process memory section"),
    ],
)
def test_hostile_process_memory_sections(dumped, tmp_path, payload, message):
    with pytest.raises(SnapshotFormatError, match=message):
        load(tmp_path, with_payload(dumped, payload))


def test_cli_sets_traced_against_rss(live_snapshot, tmp_path):
    import json

    from subproc import run_python

    path = tmp_path / "s.atrace"
    live_snapshot.dump(path)
    pm = live_snapshot.process_memory
    text = run_python(["-m", "alloctrace", "stats", str(path)])
    assert text.returncode == 0, text.stderr
    title = text.stdout.splitlines()[0]
    assert f" in {path} (" in title and "; traced " in title, text.stdout
    assert title.endswith(f" of RSS {_report.format_size(pm.rss)})"), title
    args = ["-m", "alloctrace", "stats", "--json", "--include", "nothing*", str(path)]
    filtered = run_python(args)
    assert filtered.returncode == 0, filtered.stderr
    figures = json.loads(filtered.stdout)["snapshot"]["process_memory"]
    assert {k: figures[k] for k in pm._fields} == pm._asdict()
    # The whole snapshot's traced total, not the filtered one (the RSS is the whole process's).
    assert figures["traced"] == sum(t.size for t in live_snapshot.traces) > 0
    # Without figures: no line, and null in JSON.
    old = tmp_path / "tm.pickle"
    tracemalloc.Snapshot([(0, 1, (("a.py", 1),), 1)], 1).dump(old)
    text = run_python(["-m", "alloctrace", "stats", "--allow-pickle", str(old)])
    assert "of RSS" not in text.stdout, text.stdout
    doc = run_python(["-m", "alloctrace", "stats", "--json", "--allow-pickle", str(old)])
    assert json.loads(doc.stdout)["snapshot"]["process_memory"] is None


def test_cli_diff_shows_both_rss_and_the_change(dumped, tmp_path):
    import json

    from subproc import run_python

    mib = 1 << 20
    old, new, plain = tmp_path / "old.atrace", tmp_path / "new.atrace", tmp_path / "plain.atrace"
    old.write_bytes(with_payload(dumped, uleb(5, 100 * mib, 60 * mib, 40 * mib, 0, 110 * mib)))
    new.write_bytes(with_payload(dumped, uleb(5, 130 * mib, 90 * mib, 40 * mib, 0, 140 * mib)))
    traced = sum(t.size for t in Snapshot.load(old).traces)
    text = run_python(["-m", "alloctrace", "diff", str(old), str(new)])
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    size = _report.format_size(traced)
    assert lines[1] == f"(RSS 100.0 MiB -> 130.0 MiB (+30.0 MiB); traced {size} -> {size} (+0 B))"
    # Two lines where one would not fit the terminal.
    narrow = run_python(["-m", "alloctrace", "diff", str(old), str(new)], COLUMNS="50")
    assert narrow.stdout.splitlines()[1:3] == [
        "(RSS 100.0 MiB -> 130.0 MiB (+30.0 MiB))",
        f"(traced {size} -> {size} (+0 B))",
    ], narrow.stdout
    args = ["-m", "alloctrace", "diff", "--json", "--include", "nothing*", str(old), str(new)]
    doc = run_python(args)
    assert doc.returncode == 0, doc.stderr
    assert json.loads(doc.stdout)["rss"] == {
        "old": 100 * mib,
        "new": 130 * mib,
        "diff": 30 * mib,
        # The whole snapshots' totals, not the filtered ones (the RSS is the whole process's).
        "traced_old": traced,
        "traced_new": traced,
        "traced_diff": 0,
    }
    # Only one of the two with figures: no line, and null in JSON.
    Snapshot([(0, 1, (("a.py", 1),), 1)], 1).dump(plain)
    text = run_python(["-m", "alloctrace", "diff", str(plain), str(new)])
    assert text.returncode == 0 and "RSS" not in text.stdout, text.stdout
    doc = run_python(["-m", "alloctrace", "diff", "--json", str(old), str(plain)])
    assert json.loads(doc.stdout)["rss"] is None
