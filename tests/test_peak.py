"""take_snapshot(peak=True): what was alive when the traced memory peaked, and dumps carrying
the peak. The per-traceback bookkeeping is checked against a brute-force replay in the Rust
unit tests (src/hooks/table.rs); these tests check it end to end on real allocations."""

import json
import pathlib
import pickle

import pytest

import alloctrace
from subproc import numbered_name
from subproc import run_python as run

BIG, MID, SMALL = 4000, 1500, 100


def _allocate_and_free():
    # The peak is when both lists are alive; they are freed before any snapshot.
    big = [bytearray(BIG) for _ in range(60)]  # line A
    mid = [bytearray(MID) for _ in range(25)]  # line B
    # The peak, once the comprehensions' own temporaries are gone (the end of line B, with
    # them, would otherwise be the peak when the snapshot below allocates little).
    spike = bytearray(64 * BIG)
    del spike
    alive = alloctrace.take_snapshot()
    del big, mid
    after = [bytearray(SMALL) for _ in range(10)]  # smaller than the peak
    return alive, after


def _line_of(marker, function=None):
    import inspect

    source, first = inspect.getsourcelines(function or _allocate_and_free)
    return first + next(i for i, line in enumerate(source) if marker in line)


def _by_line(snapshot):
    return {
        (s.traceback[0].filename, s.traceback[0].lineno): (s.size, s.count)
        for s in snapshot.statistics("lineno")
    }


@pytest.fixture
def tracing():
    alloctrace.start(1)
    try:
        yield
    finally:
        alloctrace.stop()


def test_peak_holds_exactly_what_was_alive_at_the_peak(tracing):
    alive, after = _allocate_and_free()
    current, peak_total = alloctrace.get_traced_memory()
    assert current < peak_total
    peak = alloctrace.take_snapshot(peak=True)
    assert peak.is_peak and not alive.is_peak
    rows = _by_line(peak)
    live_rows = _by_line(alive)
    for marker in ("# line A", "# line B"):
        key = (__file__, _line_of(marker))
        # Same bytes and blocks as a snapshot taken while they were alive: exact, though
        # every one of them is freed now.
        assert rows[key] == live_rows[key], marker
    big = rows[(__file__, _line_of("# line A"))]
    assert big[1] >= 60 and big[0] >= 60 * BIG
    # The whole peak adds up to the peak total, to the byte.
    assert sum(size for size, _ in rows.values()) == peak_total
    # The blocks allocated after the peak are not in it.
    assert (__file__, _line_of("after = [")) not in rows
    assert len(after) == 10


def test_compare_filter_dump_load_and_exports(tracing, tmp_path):
    alive, after = _allocate_and_free()
    peak = alloctrace.take_snapshot(peak=True)
    now = alloctrace.take_snapshot()
    line_a = (__file__, _line_of("# line A"))
    diffs = {
        (d.traceback[0].filename, d.traceback[0].lineno): d for d in now.compare_to(peak, "lineno")
    }
    assert diffs[line_a].size == 0 and diffs[line_a].size_diff == -_by_line(peak)[line_a][0]
    assert diffs[line_a].count_diff == -_by_line(peak)[line_a][1]
    here = peak.filter_traces([alloctrace.Filter(True, __file__)])
    assert here.is_peak and _by_line(here)[line_a] == _by_line(peak)[line_a]
    assert all(k[0] == __file__ for k in _by_line(here))
    path = tmp_path / "peak.snap"
    peak.dump(path)
    loaded = alloctrace.Snapshot.load(path)
    assert loaded.is_peak and loaded._data == peak._data
    assert _by_line(loaded) == _by_line(peak)
    carried = now._with_peak(peak)
    carried.dump(tmp_path / "now.snap")
    loaded_now = alloctrace.Snapshot.load(tmp_path / "now.snap")
    assert not loaded_now.is_peak and loaded_now._data == now._data
    assert loaded_now.peak._data == peak._data and _by_line(loaded_now.peak) == _by_line(peak)
    assert alloctrace.Snapshot.load(path).peak is None
    peak.to_collapsed(tmp_path / "peak.folded")
    folded = (tmp_path / "peak.folded").read_text()
    assert f"{_by_line(peak)[line_a][0]}" in folded
    peak.to_flamegraph(tmp_path / "peak.svg", base=now)
    assert (tmp_path / "peak.svg").read_text().startswith("<?xml")
    with pytest.raises(ValueError, match="peak"):
        peak._with_peak(peak)
    with pytest.raises(ValueError, match="peak snapshot"):
        now._with_peak(now)


def test_reset_peak_and_clear_traces_restart_it(tracing):
    _allocate_and_free()
    alloctrace.reset_peak()
    # After the reset, the peak is the current memory plus this one list.
    later = [bytearray(SMALL) for _ in range(500)]  # line C
    del later
    peak_total = alloctrace.get_traced_memory()[1]
    peak = alloctrace.take_snapshot(peak=True)
    rows = _by_line(peak)
    assert (__file__, _line_of("# line A")) not in rows
    assert (
        rows[(__file__, _line_of("# line C", test_reset_peak_and_clear_traces_restart_it))][1]
        >= 500
    )
    assert sum(size for size, _ in rows.values()) == peak_total
    alloctrace.clear_traces()
    # Only what take_snapshot() itself allocated before reading the peak.
    assert sum(s.size for s in alloctrace.take_snapshot(peak=True).statistics("lineno")) < 1000


def test_sampled_peak_is_the_estimated_peak(tmp_path):
    alloctrace.start(1, sample_interval=4096, sample_seed=7)
    try:
        _allocate_and_free()
        peak_total = alloctrace.get_traced_memory()[1]
        peak = alloctrace.take_snapshot(peak=True)
    finally:
        alloctrace.stop()
    assert peak.sample_interval == 4096
    # Estimated with the weights of get_traced_memory(), not weighted a second time.
    assert sum(s.size for s in peak.statistics("filename")) == peak_total
    peak.dump(tmp_path / "p.snap")
    assert alloctrace.Snapshot.load(tmp_path / "p.snap")._data == peak._data


def test_bad_requests():
    with pytest.raises(RuntimeError, match="must be tracing"):
        alloctrace.take_snapshot(peak=True)
    alloctrace.start()
    try:
        with pytest.raises(ValueError, match="peak=True"):
            alloctrace.take_snapshot(objects=True, peak=True)
        with pytest.raises(ValueError, match="peak=True"):
            alloctrace.take_snapshot(retention=2, peak=True)
        peak = alloctrace.take_snapshot(peak=True)
    finally:
        alloctrace.stop()
    # A peak pickles whole, as its dump loads (once refused: the raw traces lost the counts).
    back = pickle.loads(pickle.dumps(peak))
    assert back.is_peak and back._data == peak._data
    assert back.statistics("lineno") == peak.statistics("lineno")

    class Mine(alloctrace.Filter):
        def _match(self, trace):
            return True

    with pytest.raises(TypeError, match="Filter and DomainFilter"):
        peak.filter_traces([Mine(True, "*")])


PEAKY = """\
import sys
big = [bytearray(10000) for _ in range(100)]
del big
small = [bytearray(10) for _ in range(10)]
"""


def test_dump_at_exit_carries_the_peak(tmp_path):
    script = tmp_path / "peaky.py"
    script.write_text(PEAKY)
    dump = tmp_path / "out.snap"
    result = run([str(script)], ALLOCTRACE_DUMP=str(dump))
    assert result.returncode == 0, result.stderr
    snapshot = alloctrace.Snapshot.load(dump)
    rows = _by_line(snapshot)
    # Only what compiling the line left (its code) is alive at the end.
    assert rows.get((str(script), 2), (0, 0))[0] < 10000
    peak_rows = _by_line(snapshot.peak)
    size, count = peak_rows[(str(script), 2)]
    assert size >= 100 * 10000 and count >= 100


def cli(*args, cwd=None):
    return run(["-m", "alloctrace", *args], cwd=cwd)


def test_cli_shows_the_peak(tmp_path):
    script = tmp_path / "peaky.py"
    script.write_text(PEAKY)
    dump = tmp_path / "out.snap"
    result = cli("run", "-o", str(dump), str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    current, _, peak = result.stderr.partition("at the peak of")
    assert "peaky.py:2" not in current.split("Top 10")[1].splitlines()[1]
    # The peak's top line is the big list, freed before the end.
    assert "peaky.py:2" in peak.splitlines()[1], result.stderr
    stats = cli("stats", "--peak", "--json", str(dump))
    assert stats.returncode == 0, stats.stderr
    rows = json.loads(stats.stdout)
    top = rows["stats"][0]
    assert top["traceback"][-1]["lineno"] == 2 and top["size"] >= 100 * 10000, top
    # --json says which figures are of a peak.
    assert rows["snapshot"]["is_peak"] is True
    assert json.loads(cli("stats", "--json", str(dump)).stdout)["snapshot"]["is_peak"] is False
    diffed = json.loads(cli("diff", "--peak", "--json", str(dump)).stdout)
    assert (diffed["old"]["is_peak"], diffed["new"]["is_peak"]) == (True, False)
    diff = cli("diff", "--peak", str(dump))
    assert diff.returncode == 0, diff.stderr
    assert "(peak)" in diff.stdout and "peaky.py:2" in diff.stdout
    plain = tmp_path / "plain.snap"
    alloctrace.start()
    try:
        alloctrace.take_snapshot().dump(plain)
    finally:
        alloctrace.stop()
    # (arguments, exit status, message)
    for args, status, message in [
        (("stats", "--peak", str(plain)), 1, "holds no peak"),
        (("diff", "--peak", str(plain)), 1, "holds no peak"),
        (("diff", "--peak", str(dump), str(dump)), 2, "takes one snapshot file"),
        (("diff", str(dump)), 2, "needs two snapshot files"),
    ]:
        bad = cli(*args)
        assert bad.returncode == status and message in bad.stderr, (args, bad.stderr)


def test_peak_example(tmp_path):
    example = pathlib.Path(__file__).resolve().parent.parent / "examples" / "peak.py"
    result = cli("run", "-o", str(tmp_path / "peak.snap"), str(example), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    current, _, peak = result.stderr.partition("Top 10 lines at the peak of")
    rows_line = next(
        n for n, line in enumerate(example.read_text().splitlines(), 1) if "rows = [" in line
    )
    # At the peak, the rows were the top line: 50,000 dicts and their strings.
    top = peak.splitlines()[1]
    assert top.startswith("#1: ") and f"peak.py:{rows_line}: " in top, result.stderr
    assert "MiB" in top
    assert int(top.split(" in ")[1].split()[0].replace(",", "")) >= 100_000
    # The peak's title sets the traced peak against the kernel's peak RSS, not the RSS at exit.
    assert "at the peak; peak RSS " in peak.splitlines()[0], peak
    # (Below the title, which ends with the process's RSS.)
    assert "MiB" not in current.split("\n", 1)[1], current


class _OldPickle:
    """Pickles as snapshots did before they were pickled as their file's bytes."""

    def __init__(self, raw, limit, state):
        self.args = (raw, limit, state)

    def __reduce__(self):
        raw, limit, state = self.args
        return (alloctrace.Snapshot, (raw, limit), state)


def test_pickling_carries_the_peak_and_all_that_load_does():
    alloctrace.start(2)
    try:
        alive, after = _allocate_and_free()
        peak = alloctrace.take_snapshot(peak=True)
        now = alloctrace.take_snapshot(objects=True)
    finally:
        alloctrace.stop()
    peak.note = {"a set", "is not plain"}  # pickles, though dump() would refuse it
    back = pickle.loads(pickle.dumps(peak, pickle.HIGHEST_PROTOCOL))
    assert back.is_peak and back.note == peak.note
    # Sizes and block counts per line: a peak's traces stand for many blocks each.
    assert _by_line(back) == _by_line(peak)
    assert back.statistics("traceback") == peak.statistics("traceback")

    # A snapshot with its peak attached, as dumps carry it: the peak, the process memory,
    # the metadata and the object kinds come through too.
    carried = now._with_peak(peak)
    back = pickle.loads(pickle.dumps(carried))
    assert back.peak is not None and _by_line(back.peak) == _by_line(peak)
    assert back.process_memory == carried.process_memory is not None
    assert back.metadata == carried.metadata and back.metadata["pid"] is not None
    assert back.has_objects
    assert back.statistics("lineno+type") == carried.statistics("lineno+type")
    assert len(alive.traces) > 0 and len(after) == 10


def test_pickles_made_before_still_load():
    raw = [(0, 10, (("a.py", 1),), 1), (0, 20, (("b.py", 2),), 1)]
    old = pickle.loads(pickle.dumps(_OldPickle(raw, 1, {"note": "old"})))
    assert type(old) is alloctrace.Snapshot and old.note == "old"
    assert sorted(t.size for t in old.traces) == [10, 20] and not old.is_peak


# Three phases, each allocating then freeing one line's memory; a numbered snapshot (asked by
# signal, written by the same code as the interval ones) ends each of the first two.
PHASES = """\
import os, signal, sys, time
import alloctrace

def numbered(n):
    os.kill(os.getpid(), signal.SIGUSR2)
    deadline = time.monotonic() + 60
    while not os.path.exists(f"{sys.argv[1][:-5]}.{n}.snap") and time.monotonic() < deadline:
        time.sleep(0.01)

first = [bytearray(3000) for _ in range(1000)]
del first
numbered(1)
print(alloctrace.get_traced_memory()[1] < 2_000_000)
second = [bytearray(1000) for _ in range(1000)]
del second
numbered(2)
third = [bytearray(2000) for _ in range(1000)]
del third
"""
PHASE_LINES = {"first": 10, "second": 14, "third": 17}


def test_numbered_dumps_carry_the_peak_of_their_interval_and_the_exit_dump_the_runs(tmp_path):
    script = tmp_path / "phases.py"
    script.write_text(PHASES)
    dump = tmp_path / "p.snap"
    result = run(
        [str(script), str(dump)],
        cwd=tmp_path,
        ALLOCTRACE_DUMP=str(dump),
        ALLOCTRACE_SIGNAL="SIGUSR2",
    )
    assert result.returncode == 0, result.stderr
    # The program's own peak started afresh after the first numbered snapshot.
    assert result.stdout == "True\n"

    def phases_at_peak(path):
        peak = alloctrace.Snapshot.load(str(path)).peak
        lines = {
            s.traceback[0].lineno: s.size
            for s in peak.statistics("lineno")
            if s.traceback[0].filename == str(script)
        }
        return {name for name, line in PHASE_LINES.items() if lines.get(line, 0) >= 900_000}

    assert phases_at_peak(numbered_name(dump, 1)) == {"first"}
    assert phases_at_peak(numbered_name(dump, 2)) == {"second"}
    # The exit snapshot: the whole run's peak, the first phase's (3 MB), not the last's.
    assert phases_at_peak(dump) == {"first"}
