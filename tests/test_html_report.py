"""The HTML report (alloctrace._html_report): its figures, its bad-input errors, its size on a
big snapshot, and the page itself in a real headless Chromium (tests/browser.py)."""

import json
import os
import re
import shutil
import textwrap

import pytest

import alloctrace
from alloctrace import _html_report, _report
from browser import Browser, blobs, chromium_or_skip, read_png
from subproc import run_python

# A program that writes a series of snapshots of itself: a line that grows for four steps and
# then drops (so the peak is the fourth snapshot), a line that stays the same, and a line that
# only appears later. Snapshots record object kinds and retention reports. (Without threading
# imported first, take_snapshot(retention=) imports it, traced: about 320 KiB of code objects on
# 3.11, as large as the growing line at its third snapshot.)
SERIES = textwrap.dedent(
    """\
    import os, sys, threading, time  # threading before tracing, as most programs have it
    import alloctrace

    alloctrace.start(4)
    out = sys.argv[1]
    names = ["d", "b", "e", "a", "c"]  # file names deliberately not in time order
    keep = []
    steady = [bytearray(3000) for _ in range(30)]
    late = []

    def grow(n):
        keep.append([bytearray(1000) for _ in range(n)])

    def shrink():
        del keep[:3]

    def arrive():
        late.append([bytearray(500) for _ in range(40)])

    previous = None
    for step in range(5):
        if step < 4:
            grow(100)
        else:
            shrink()
        if step >= 2:
            arrive()
        snapshot = alloctrace.take_snapshot(objects=True, retention=2, baseline=previous)
        snapshot.dump(os.path.join(out, f"snap-{names[step]}.bin"))
        previous = snapshot
        time.sleep(0.05)
    """
)


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """Five snapshot files of one process, and the script that wrote them."""
    directory = tmp_path_factory.mktemp("series")
    script = directory / "series_app.py"
    script.write_text(SERIES)
    result = run_python([str(script), str(directory)], cwd=str(directory))
    assert result.returncode == 0, result.stderr
    paths = sorted(str(p) for p in directory.glob("snap-*.bin"))
    assert len(paths) == 5
    return directory, script, paths


def line_of(script, text):
    for number, line in enumerate(script.read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(text)


def in_time_order(paths):
    loaded = [(alloctrace.Snapshot.load(p), p) for p in paths]
    loaded.sort(key=lambda item: item[0].metadata["timestamp"])
    return [p for _, p in loaded], [s for s, _ in loaded]


def test_series_in_time_order_whatever_the_argument_order(series):
    _, _, paths = series
    ordered, _ = in_time_order(paths)
    for given in (paths, list(reversed(paths)), ordered):
        got = [path for path, _ in _html_report.load_series(given)]
        assert got == ordered
    # The names were chosen so that sorting them does not give the time order.
    assert ordered != sorted(paths)


def test_figures_match_the_snapshots(series, tmp_path, monkeypatch):
    directory, script, paths = series
    # The retention text names files under the current directory relative to it: work
    # elsewhere, so that the script keeps its full name wherever pytest runs (from /tmp, say).
    monkeypatch.chdir(tmp_path)
    ordered, snapshots = in_time_order(paths)
    data = _html_report.build_data(_html_report.load_series(paths))
    assert [s["path"] for s in data["snapshots"]] == ordered
    totals = [sum(stat.size for stat in s.statistics("filename")) for s in snapshots]
    assert [s["size"] for s in data["snapshots"]] == totals
    assert data["peak"] == totals.index(max(totals)) == 3
    assert data["pid"] == snapshots[0].metadata["pid"]

    grow_line = line_of(script, "keep.append(")

    def site_id(lineno):
        (found,) = [
            i
            for i, s in enumerate(data["sites"])
            if s[1] == lineno and "series_app" in data["files"][s[0]]
        ]
        return found

    grow = site_id(grow_line)
    assert data["sites"][grow][2] == "grow"
    assert data["sites"][grow][3] == "keep.append([bytearray(1000) for _ in range(n)])"
    # The chart's series: the growing line, with its size in every snapshot.
    (series_row,) = [s for s in data["series"] if s["site"] == grow]
    for snapshot, size in zip(snapshots, series_row["sizes"]):
        stats = {
            (st.traceback[0].filename, st.traceback[0].lineno): st.size
            for st in snapshot.statistics("lineno")
        }
        assert size == stats[(str(script), grow_line)]
    # Rows: [site, size, count, growth since previous (size, count), since first (size, count)].
    for i in (2, 4):
        rows = {row[0]: row for row in data["snapshots"][i]["lines"]}
        for base_offset, base in ((3, snapshots[i - 1]), (5, snapshots[0])):
            diffs = {
                (d.traceback[0].filename, d.traceback[0].lineno): d
                for d in snapshots[i].compare_to(base, "lineno")
            }
            d = diffs[(str(script), grow_line)]
            assert rows[grow][1:3] == [d.size, d.count]
            assert rows[grow][base_offset : base_offset + 2] == [d.size_diff, d.count_diff]
    first_rows = data["snapshots"][0]["lines"]
    assert all(row[3:] == [None, None, None, None] for row in first_rows)
    # Object kinds and retention reports were recorded, so they are carried.
    kinds = dict((k[0], k[1]) for k in data["snapshots"][4]["kinds"])
    assert kinds == {st.kind: st.size for st in snapshots[4].statistics("type")[: len(kinds)]}
    assert f"{script}:{line_of(script, 'late.append(')}: " in data["snapshots"][4]["retention"]


def test_flamegraph_tree_is_the_folded_stacks(series):
    _, _, paths = series
    data = _html_report.build_data(_html_report.load_series(paths))
    snap = data["snapshots"][1]
    flat = snap["flame"]
    names, values, depths = flat[0::3], flat[1::3], flat[2::3]
    assert depths[0] == 0 and values[0] == snap["size"]
    # Each node's children add up to at most its own bytes.
    for i, depth in enumerate(depths):
        children = []
        for j in range(i + 1, len(depths)):
            if depths[j] <= depth:
                break
            if depths[j] == depth + 1:
                children.append(values[j])
        assert sum(children) <= values[i]
    assert any(data["names"][n].startswith("grow (") for n in names)


def test_flamegraph_keeps_the_largest_frames():
    traces = [(0, 1000 - i, (("f.py", 100 + i), ("main.py", 1)), 2) for i in range(100)]
    snapshot = alloctrace.Snapshot(traces, 2)
    frames, flat = snapshot._data.flame(10)
    kept = [frames[n] if n >= 0 else "all" for n in flat[0::3]]
    # Root, main, and the 8 largest children, largest first.
    assert kept == ["all", ("main.py", 1, None)] + [("f.py", 100 + i, None) for i in range(8)]
    assert flat[1] == sum(size for _, size, _, _ in traces)
    assert flat[2::3] == [0, 1] + [2] * 8
    # The page names them "file:line" where no function was recorded.
    data = _html_report.build_data([("x.snap", snapshot)])
    names = [data["names"][n] for n in data["snapshots"][0]["flame"][0::3]]
    assert names[:3] == ["all", "main.py:1", "f.py:100"]


def test_long_series_embeds_some_snapshots_in_full(tmp_path, monkeypatch):
    monkeypatch.setattr(_html_report, "EMBEDDED_MAX", 5)
    paths = []
    for i in range(23):
        grow = (0, 1000 * (i + 1), (("app.py", 7),), 1)
        spike = [(0, 50_000, (("app.py", 9),), 1)] if i == 11 else []
        snapshot = alloctrace.Snapshot([grow, *spike], 1)
        path = tmp_path / f"s-{i}.snap"
        snapshot.dump(str(path))
        os.utime(path, (1000 + i, 1000 + i))
        paths.append(str(path))
    data = _html_report.write_report(list(reversed(paths)), str(tmp_path / "r.html"))
    docs = data["snapshots"]
    assert [d["path"] for d in docs] == paths
    full = [i for i, d in enumerate(docs) if d["lines"] is not None]
    # The first, the last, the largest, and the rest spread between them.
    assert len(full) == data["embedded"] == 5 and {0, 11, 22} <= set(full)
    assert all(docs[i]["flame"] is None for i in range(23) if i not in full)
    # Every snapshot is a point of the chart with its figures.
    assert [d["size"] for d in docs] == [
        1000 * (i + 1) + (50_000 if i == 11 else 0) for i in range(23)
    ]
    (grow,) = [s for s in data["series"] if data["sites"][s["site"]][1] == 7]
    assert grow["sizes"] == [1000 * (i + 1) for i in range(23)]
    # An embedded snapshot's growth is against the snapshot just before it, embedded or not.
    row = next(r for r in docs[22]["lines"] if data["sites"][r[0]][1] == 7)
    assert row[1:5] == [23_000, 1, 1000, 0]


def raw_snapshot_file(path, traces, limit=3, sample_interval=None):
    alloctrace.Snapshot(traces, limit, sample_interval=sample_interval).dump(str(path))
    return str(path)


def test_bad_input_names_the_file(tmp_path, series):
    _, _, paths = series
    with pytest.raises(_html_report.ReportError, match="no snapshot files given"):
        _html_report.load_series([])
    corrupt = tmp_path / "corrupt.snap"
    corrupt.write_bytes(b"not a snapshot at all")
    with pytest.raises(_html_report.ReportError, match=re.escape(str(corrupt))):
        _html_report.load_series([paths[0], str(corrupt)])
    missing = str(tmp_path / "missing.snap")
    with pytest.raises(_html_report.ReportError, match=f"cannot read {re.escape(missing)}"):
        _html_report.load_series([missing])
    # Another process: a snapshot written by a second run of the same program.
    other = tmp_path / "other"
    other.mkdir()
    script = tmp_path / "one.py"
    script.write_text(
        "import alloctrace, sys\nalloctrace.start()\nx = [bytes(100) for _ in range(10)]\n"
        "alloctrace.take_snapshot().dump(sys.argv[1])\n"
    )
    assert run_python([str(script), str(other / "x.snap")]).returncode == 0
    with pytest.raises(_html_report.ReportError) as info:
        _html_report.load_series([paths[0], str(other / "x.snap")])
    message = str(info.value)
    assert message.startswith(str(other / "x.snap") + ": written by process ")
    assert "\n" not in message
    # Exact and sampled.
    exact = raw_snapshot_file(tmp_path / "exact.snap", [(0, 10, (("a.py", 1),))])
    sampled = raw_snapshot_file(
        tmp_path / "sampled.snap", [(0, 10, (("a.py", 1),))], sample_interval=4096
    )
    with pytest.raises(_html_report.ReportError) as info:
        _html_report.load_series([exact, sampled])
    assert str(info.value) == (
        f"{sampled}: sampled at 4 KiB, but {exact} is exact: a report cannot mix exact and "
        "sampled figures"
    )


def test_a_million_traces_make_a_small_page(tmp_path):
    # 1M traces over 50,000 distinct three-frame stacks in 1,000 files.
    frames = [
        (
            (f"/srv/app/pkg{i % 1000}/module.py", i % 300 + 1),
            (f"/srv/app/callers/c{i % 97}.py", i % 50 + 10),
            ("/srv/app/main.py", i % 7 + 1),
        )
        for i in range(50_000)
    ]
    traces = [(0, 64 + i % 1000, frames[i % 50_000]) for i in range(1_000_000)]
    path = raw_snapshot_file(tmp_path / "big.snap", traces)
    del traces
    output = tmp_path / "big.html"
    data = _html_report.write_report([path], str(output))
    size = output.stat().st_size
    assert size < 5 * 1024 * 1024, size
    # (i mod 1000, i mod 300) takes lcm(1000, 300) = 3000 values: that many distinct lines.
    assert data["snapshots"][0]["lines_total"] == 3000
    assert len(data["snapshots"][0]["flame"]) // 3 <= _html_report.FLAME_MAX + 1


def test_embedded_data_cannot_end_the_script(tmp_path):
    name = "</script><script>alert(1)</script>.py"
    path = raw_snapshot_file(tmp_path / "odd.snap", [(0, 100, ((name, 1),))])
    output = tmp_path / "odd.html"
    _html_report.write_report([path], str(output))
    page = output.read_text()
    assert "</script><script>alert(1)" not in page
    start = page.index('type="application/json">') + len('type="application/json">')
    data = json.loads(page[start : page.index("</script>", start)])
    assert data["files"] == [name]


# --------------------------------------------------------------------------- in a browser


def texts(browser, selector):
    return browser.eval(
        f"[].map.call(document.querySelectorAll({json.dumps(selector)}), e => e.textContent)"
    )


def choose(browser, selector, value, event):
    """Set a form control's value as a user would, and send the event the page listens to."""
    browser.eval(
        f"(e => {{ e.value = {json.dumps(value)}; "
        f"e.dispatchEvent(new Event({json.dumps(event)})); }})"
        f"(document.querySelector({json.dumps(selector)}))"
    )


@pytest.fixture(scope="module")
def page(series, tmp_path_factory):
    executable = chromium_or_skip()
    _, _, paths = series
    output = tmp_path_factory.mktemp("page") / "report.html"
    data = _html_report.write_report(list(reversed(paths)), str(output))
    with Browser(executable) as browser:
        browser.open(str(output))
        yield browser, data


def test_page_loads_without_errors(page):
    browser, data = page
    assert browser.eval("document.documentElement.getAttribute('data-ready')") == "1"
    assert browser.eval("document.documentElement.getAttribute('data-errors')") is None
    assert browser.errors() == []
    # Nothing was fetched: every resource is inline.
    page_url = browser.eval("location.href")
    requested = [
        e["params"]["request"]["url"]
        for e in browser.events
        if e["method"] == "Network.requestWillBeSent"
    ]
    assert requested and set(requested) == {page_url}
    assert (
        browser.eval("document.querySelectorAll('script[src], link[href], img[src]').length") == 0
    )


def test_chart_shows_every_snapshot_and_the_peak(page):
    browser, data = page
    snapshots = data["snapshots"]
    assert browser.eval("document.querySelectorAll('circle.pt').length") == len(snapshots)
    peak = data["peak"]
    label = browser.eval("document.getElementById('peak-label').textContent")
    assert label.startswith(f"peak {_report.format_size(snapshots[peak]['size'])} (#{peak + 1} at ")
    # Points go left to right in time order, and the peak point is the highest.
    xs = browser.eval(
        "[].map.call(document.querySelectorAll('circle.pt'), c => +c.getAttribute('cx'))"
    )
    ys = browser.eval(
        "[].map.call(document.querySelectorAll('circle.pt'), c => +c.getAttribute('cy'))"
    )
    assert xs == sorted(xs)
    assert ys.index(min(ys)) == peak
    # Hovering over a point shows its figures.
    x, y = browser.center("circle.pt[data-i='1']")
    browser.hover(x, y)
    tip = browser.eval("(t => t.hidden ? null : t.textContent)(document.getElementById('tooltip'))")
    assert tip is not None
    assert (
        f"traced {_report.format_size(snapshots[1]['size'])} in {snapshots[1]['count']:,} blocks"
        in tip
    )


def test_screenshot_agrees_with_the_data(page):
    browser, data = page
    browser.scroll_to("#chart")
    width, height, rows = read_png(browser.screenshot("#chart svg"))
    points = sorted(blobs(rows, (0x1F, 0x4E, 0x9E)))
    # One round blob per snapshot (the selected one has a ring of another colour around it).
    assert len(points) == len(data["snapshots"]), points
    assert all(n > 20 for _, _, n in points)
    (marker,) = blobs(rows, (0xE6, 0x00, 0x7E))
    highest = min(range(len(points)), key=lambda i: points[i][1])
    assert highest == data["peak"]
    assert abs(marker[0] - points[highest][0]) < 2
    assert marker[1] < points[highest][1]


def test_selecting_sorting_and_filtering_the_lines(page, series):
    browser, data = page
    _, script, _ = series
    grow_line = line_of(script, "keep.append(")
    # The last snapshot is selected at first.
    assert browser.eval("document.documentElement.getAttribute('data-selected')") == "4"
    browser.scroll_to("#chart")
    x, y = browser.center("circle.pt[data-i='2']")
    browser.click(x, y)
    assert browser.eval("document.documentElement.getAttribute('data-selected')") == "2"
    snap = data["snapshots"][2]
    title = browser.eval("document.getElementById('selected-title').textContent")
    assert title.startswith("Top lines of snapshot #3 at ")
    assert f": {_report.format_size(snap['size'])} in {snap['count']:,} blocks" in title

    def column(name):
        return texts(browser, f"#lines tbody td.{name}")

    def where():
        return browser.eval(
            "[].map.call(document.querySelectorAll('#lines tbody tr'), r => r.dataset.site)"
        )

    def site_text(row):
        site = data["sites"][row[0]]
        return f"{data['files'][site[0]]}:{site[1]}"

    by_size = sorted(snap["lines"], key=lambda r: -r[1])
    assert column("size")[0] == _report.format_size(by_size[0][1])
    assert where()[0] == site_text(by_size[0])
    assert where()[0].endswith(f"series_app.py:{grow_line}")
    # Sort by count.
    browser.click(*browser.center("#lines th[data-sort='count']"))
    counts = [int(c.replace(",", "")) for c in column("count")]
    assert counts == sorted(counts, reverse=True)
    assert counts[0] == max(r[2] for r in snap["lines"])
    # Sort by growth, twice: ascending.
    browser.click(*browser.center("#lines th[data-sort='growth']"))
    browser.click(*browser.center("#lines th[data-sort='growth']"))
    assert (
        browser.eval(
            "document.querySelector(\"#lines th[data-sort='growth']\").getAttribute('aria-sort')"
        )
        == "ascending"
    )
    growth = sorted(snap["lines"], key=lambda r: r[3])
    assert column("growth")[0] == (
        f"+{_report.format_size(growth[0][3])}"
        if growth[0][3] > 0
        else _report.format_size(growth[0][3])
    )
    # Filter by function name.
    browser.type_into("#search", "arrive")
    shown = where()
    assert shown and all(
        s.endswith(f"series_app.py:{line_of(script, 'late.append(')}") for s in shown
    )
    choose(browser, "#search", "", "input")
    assert len(where()) == len(snap["lines"])


def test_diff_against_previous_and_first(page):
    browser, data = page
    browser.scroll_to("#chart")
    browser.click(*browser.center("circle.pt[data-i='4']"))
    snaps = data["snapshots"]
    summary = browser.eval("document.getElementById('diff-summary').textContent")
    change = snaps[4]["size"] - snaps[3]["size"]
    assert summary.startswith(f"Total: {_report.format_size(change, signed=True)} (")
    choose(browser, "#baseline", "first", "change")
    summary = browser.eval("document.getElementById('diff-summary').textContent")
    change = snaps[4]["size"] - snaps[0]["size"]
    assert summary.startswith(f"Total: {_report.format_size(change, signed=True)} (")
    assert "first snapshot" in browser.eval("document.getElementById('diff-title').textContent")
    first = browser.eval("document.querySelector('#diff tbody td.growth').textContent")
    largest = max(snaps[4]["lines"], key=lambda r: abs(r[5]))
    assert first == _report.format_size(largest[5], signed=True)
    choose(browser, "#baseline", "previous", "change")
    # The first snapshot has nothing to compare with.
    browser.scroll_to("#chart")
    browser.click(*browser.center("circle.pt[data-i='0']"))
    assert "first snapshot" in browser.eval("document.getElementById('diff-summary').textContent")


def test_flamegraph_zoom_and_search(page):
    browser, data = page
    browser.scroll_to("#chart")
    browser.click(*browser.center("circle.pt[data-i='3']"))
    browser.scroll_to("#flame")
    root = browser.eval("document.querySelector('#flame .frame').textContent")
    assert root == "all"
    title = browser.eval("document.getElementById('flame-title').textContent")
    assert title.endswith(": " + _report.format_size(data["snapshots"][3]["size"]))
    browser.type_into("#flame-search", "grow (")
    status = browser.eval("document.getElementById('flame-status').textContent")
    assert re.search(r"\d+ frames match", status), status
    assert browser.eval("document.querySelectorAll('#flame .frame.match').length") >= 1
    # Zoom into the matching frame: it becomes full width.
    browser.click(*browser.center("#flame .frame.match"))
    status = browser.eval("document.getElementById('flame-status').textContent")
    assert status.startswith("zoomed into grow (")
    widths = browser.eval(
        "[document.querySelector('#flame').clientWidth, [].filter.call("
        "document.querySelectorAll('#flame .frame'), f => f.textContent.startsWith('grow ('))"
        "[0].offsetWidth]"
    )
    assert abs(widths[0] - widths[1]) <= 2
    browser.click(*browser.center("#flame-reset"))
    assert not browser.eval("document.getElementById('flame-status').textContent").startswith(
        "zoomed"
    )


def test_kinds_and_retention_sections(page):
    browser, data = page
    browser.scroll_to("#chart")
    browser.click(*browser.center("circle.pt[data-i='4']"))
    assert browser.eval("document.getElementById('kinds-section').hidden") is False
    first_kind = browser.eval("document.querySelector('#kinds tbody td').textContent")
    assert first_kind == data["snapshots"][4]["kinds"][0][0]
    assert (
        browser.eval("document.getElementById('retention').textContent")
        == data["snapshots"][4]["retention"]
    )


# --------------------------------------------------------------------------- the command


def alloctrace_cli(*args, cwd=None):
    return run_python(["-m", "alloctrace", *args], cwd=cwd)


def test_report_command_writes_the_page(series, tmp_path):
    _, _, paths = series
    output = tmp_path / "report.html"
    result = alloctrace_cli("report", *reversed(paths), "-o", str(output), "--title", "My run")
    assert result.returncode == 0, result.stderr
    assert result.stdout == result.stderr == ""
    page = output.read_text()
    assert "<title>My run</title>" in page
    start = page.index('type="application/json">') + len('type="application/json">')
    data = json.loads(page[start : page.index("</script>", start)])
    assert [s["path"] for s in data["snapshots"]] == in_time_order(paths)[0]
    assert [name for name in os.listdir(tmp_path)] == ["report.html"]


def test_report_command_bad_input(series, tmp_path):
    _, _, paths = series
    output = tmp_path / "report.html"
    output.write_text("the previous report")
    corrupt = tmp_path / "corrupt.snap"
    corrupt.write_bytes(b"\0" * 64)
    sampled = raw_snapshot_file(
        tmp_path / "sampled.snap", [(0, 10, (("a.py", 1),))], sample_interval=1024
    )
    cases = [
        ((), 2, "alloctrace: error: no snapshot files given (see 'alloctrace report --help')"),
        ((paths[0], str(corrupt)), 1, f"alloctrace: error: {corrupt}"),
        ((str(tmp_path / "none.snap"),), 1, f"alloctrace: error: cannot read {tmp_path}/none.snap"),
        ((paths[0], sampled), 1, f"alloctrace: error: {sampled}: sampled at 1 KiB, but "),
    ]
    for files, status, start in cases:
        result = alloctrace_cli("report", *files, "-o", str(output))
        assert result.returncode == status, result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(start), (files, result.stderr)
        # A failed report leaves the previous one alone, and no temporary file.
        assert output.read_text() == "the previous report"
        assert sorted(os.listdir(tmp_path)) == ["corrupt.snap", "report.html", "sampled.snap"]
    result = alloctrace_cli("report", paths[0], "-o", str(tmp_path / "no" / "dir.html"))
    assert result.returncode == 1
    assert result.stderr == (
        f"alloctrace: error: cannot write {tmp_path}/no/dir.html: No such file or directory\n"
    )


# A program whose memory spikes in one function and then falls: its dumps (one on a signal, one
# at exit) both carry the same session peak, where the spike line holds ~3 MB.
SPIKE = textwrap.dedent(
    """\
    import os, signal, time

    def spike():
        tmp = [bytearray(10000) for _ in range(300)]  # the spike line
        return len(tmp)

    spike()
    keep = [bytearray(1000) for _ in range(50)]
    os.kill(os.getpid(), signal.SIGUSR2)
    for _ in range(100):
        time.sleep(0.01)
    """
)


@pytest.fixture(scope="module")
def spiky(tmp_path_factory):
    """Two dumps of one process carrying the same peak, and the script that wrote them."""
    directory = tmp_path_factory.mktemp("spiky")
    script = directory / "spike_app.py"
    script.write_text(SPIKE)
    env = {"ALLOCTRACE": "4", "ALLOCTRACE_DUMP": "app-{n}.snap", "ALLOCTRACE_SIGNAL": "SIGUSR2"}
    result = run_python([str(script)], cwd=str(directory), **env)
    assert result.returncode == 0, result.stderr
    paths = sorted(str(p) for p in directory.glob("app-*.snap"))
    assert len(paths) == 2, paths
    return directory, script, paths


def test_peak_stored_with_dumps_is_embedded_once(spiky):
    _, script, paths = spiky
    data = _html_report.build_data(_html_report.load_series(paths))
    assert [s["peak"] for s in data["snapshots"]] == [0, 0]
    (peak,) = data["peaks"]
    stored = alloctrace.Snapshot.load(paths[-1]).peak
    stats = stored.statistics("lineno")
    assert (peak["size"], peak["count"]) == (
        sum(s.size for s in stats),
        sum(s.count for s in stats),
    )
    site, size, count = peak["lines"][0]
    assert data["sites"][site][1] == line_of(script, "the spike line")
    assert (size, count) == (stats[0].size, stats[0].count) and size >= 3_000_000
    # The flamegraph's root is the whole peak; the live one's is the snapshot's total.
    assert peak["flame"][1] == peak["size"]
    assert data["snapshots"][1]["flame"][1] == data["snapshots"][1]["size"] < size
    # Snapshots without a stored peak: none embedded.
    assert build_without_peaks(paths[-1])["peaks"] == []


def build_without_peaks(path):
    bare = alloctrace.Snapshot(alloctrace.Snapshot.load(path).traces._traces, 4)
    return _html_report.build_data([(path, bare)])


def test_peak_flamegraph_and_lines_in_the_page(spiky, tmp_path):
    executable = chromium_or_skip()
    _, script, paths = spiky
    output = tmp_path / "report.html"
    data = _html_report.write_report(paths, str(output))
    peak = data["peaks"][0]
    with Browser(executable) as browser:
        browser.open(str(output))
        assert browser.errors() == []
        assert browser.eval("document.getElementById('flame-which').hidden") is False
        live = browser.eval("document.getElementById('flame-title').textContent")
        assert live.startswith("Flamegraph of snapshot #2")
        assert live.endswith(": " + _report.format_size(data["snapshots"][1]["size"]))
        choose(browser, "#flame-which", "peak", "change")
        title = browser.eval("document.getElementById('flame-title').textContent")
        assert title.startswith("Flamegraph at the peak stored with snapshot #2"), title
        assert title.endswith(": " + _report.format_size(peak["size"])), title
        # The spike's frame spans most of the width: it held most of the peak.
        widths = browser.eval(
            "[document.querySelector('#flame').clientWidth, [].filter.call("
            "document.querySelectorAll('#flame .frame'), f => f.textContent.startsWith('spike ('))"
            "[0].offsetWidth]"
        )
        assert widths[1] >= widths[0] * peak["lines"][0][1] / peak["size"] - 2, widths
        # The top lines at the peak, checked against the data.
        assert browser.eval("document.getElementById('peak-section').hidden") is False
        heading = browser.eval("document.getElementById('peak-title').textContent")
        assert heading.endswith(
            f": {_report.format_size(peak['size'])} in {peak['count']:,} blocks"
        ), heading
        first = browser.eval(
            "(r => [r.getAttribute('data-site'), r.querySelector('td.size').textContent, "
            "r.querySelector('td.count').textContent])"
            "(document.querySelector('#peak-lines tbody tr'))"
        )
        spike_line = line_of(script, "the spike line")
        assert first[0].endswith(f"spike_app.py:{spike_line}"), first
        assert first[1:] == [
            _report.format_size(peak["lines"][0][1]),
            f"{peak['lines'][0][2]:,}",
        ]
        rows = browser.eval("document.querySelectorAll('#peak-lines tbody tr').length")
        assert rows == len(peak["lines"])
        # Back to the live flamegraph.
        choose(browser, "#flame-which", "current", "change")
        assert browser.eval("document.getElementById('flame-title').textContent") == live


def test_no_peak_controls_without_stored_peaks(page):
    browser, data = page
    assert data["peaks"] == []
    assert browser.eval("document.getElementById('flame-which').hidden") is True
    assert browser.eval("document.getElementById('peak-section').hidden") is True


# --------------------------------------------------------------------------- a capture

# A process tree: a parent allocates a shared block before forking (inherited: alive in every
# process), one child leaks over several numbered snapshots and exits, one child is SIGKILLed
# once it wrote a numbered snapshot. Children wait for their numbered snapshots in the
# manifest, not for a time, so that a loaded machine changes nothing.
TREE = textwrap.dedent(
    """\
    import json, os, signal, sys, time

    def numbered():
        path = os.path.join(os.environ["ALLOCTRACE_CAPTURE"], "manifest.jsonl")
        with open(path) as file:
            records = [json.loads(line) for line in file]
        return sum(1 for r in records if r["event"] == "snapshot" and r["pid"] == os.getpid()
                   and r.get("n") is not None)

    def wait_numbered(n):
        deadline = time.monotonic() + 60
        while numbered() < n and time.monotonic() < deadline:
            time.sleep(0.02)

    shared = [bytearray(2000) for _ in range(1000)]  # SHARED
    r, w = os.pipe()
    leaker = os.fork()
    if leaker == 0:
        kept = []
        for step in range(3):
            kept.append([bytearray(1000) for _ in range(300)])  # LEAK
            wait_numbered(step + 1)
        sys.exit(0)
    victim = os.fork()
    if victim == 0:
        junk = [bytearray(500) for _ in range(100)]
        wait_numbered(1)
        os.write(w, b"x")
        time.sleep(120)
    os.read(r, 1)
    os.kill(victim, signal.SIGKILL)
    os.waitpid(victim, 0)
    os.waitpid(leaker, 0)
    print(leaker, victim)
    """
)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A capture of a three-process tree, its script, and the pids of the two children."""
    directory = tmp_path_factory.mktemp("tree")
    script = directory / "tree_app.py"
    script.write_text(TREE)
    result = alloctrace_cli(
        "run", "-q", "--interval", "0.1", "--capture", "cap", str(script), cwd=str(directory)
    )
    assert result.returncode == 0, result.stderr
    leaker, victim = map(int, result.stdout.split())
    return directory, script, leaker, victim


def test_capture_report_shows_the_tree_the_merged_lines_and_memory_over_time(tree):
    directory, script, leaker, victim = tree
    output = directory / "tree.html"
    result = alloctrace_cli("report", "cap", "-o", str(output), cwd=str(directory))
    assert result.returncode == 0, result.stderr
    page = output.read_text()
    start = page.index('type="application/json">') + len('type="application/json">')
    data = json.loads(page[start : page.index("</script>", start)])
    capture = data["capture"]
    rows = {p["pid"]: p for p in capture["processes"]}
    assert len(rows) == 3
    root = capture["processes"][0]
    assert root["depth"] == 0 and root["parent"] is None and not root["killed"]
    assert root["argv"][-1].endswith("tree_app.py")
    assert rows[leaker]["ppid"] == rows[victim]["ppid"] == root["pid"]
    assert rows[leaker]["depth"] == rows[victim]["depth"] == 1
    assert rows[victim]["killed"] and rows[victim]["signal"] == "SIGKILL"
    assert rows[victim]["ending"] == "killed by SIGKILL, before its exit snapshot"
    assert rows[victim]["snapshot"] and rows[victim]["numbered"] >= 1
    assert rows[leaker]["code"] == 0 and not rows[leaker]["killed"]
    assert rows[leaker]["snapshot"] == f"{rows[leaker]['snapshot'].split('.')[0]}.snap"
    # Memory over time: the leaker's numbered snapshots and its exit one, growing.
    points = rows[leaker]["points"]
    assert len(points) >= 4 and rows[leaker]["numbered"] >= 3
    assert [t for t, _ in points] == sorted(t for t, _ in points)
    assert points[-1][1] >= points[0][1] + 300_000  # two more steps of ~310 KB at least
    assert rows[leaker]["peak"] >= rows[leaker]["size"] == points[-1][1]
    # The totals: exit snapshots only at exit; peaks summed.
    assert capture["total_at_exit"] == root["size"] + rows[leaker]["size"]
    assert capture["peak_sum"] >= capture["total_at_exit"] + rows[victim]["size"]
    # Merged lines, as 'stats' over the capture sums them.
    stats = alloctrace_cli("stats", "--json", "--limit", "0", "cap", cwd=str(directory))
    assert stats.returncode == 0, stats.stderr
    expected = json.loads(stats.stdout)["stats"]
    shown = [
        [data["sites"][site][1], size, count, n] for site, size, count, n in capture["lines"][:2]
    ]
    assert shown == [
        [s["traceback"][0]["lineno"], s["size"], s["count"], s["processes"]] for s in expected[:2]
    ]
    assert shown[0][0] == line_of(script, "# SHARED") and shown[0][3] == 3
    leak = line_of(script, "# LEAK")
    rows = [[data["sites"][r[0]][1], *r[1:]] for r in capture["lines"]]
    expected = [
        [s["traceback"][0]["lineno"], s["size"], s["count"], s["processes"]]
        for s in json.loads(stats.stdout)["stats"]
        if s["traceback"][0]["filename"].endswith("tree_app.py")
    ]
    assert [r for r in rows if r[0] == leak] == [r for r in expected if r[0] == leak]
    assert [r[3] for r in rows if r[0] == leak] == [1]
    assert data["files"][data["sites"][capture["lines"][0][0]][0]].endswith("tree_app.py")


def test_capture_page_in_a_browser(tree):
    executable = chromium_or_skip()
    directory, script, leaker, victim = tree
    output = directory / "tree-browser.html"
    data = _html_report.write_capture_report(str(directory / "cap"), str(output))
    with Browser(executable) as browser:
        browser.open(str(output))
        assert browser.eval("document.documentElement.getAttribute('data-ready')") == "1"
        assert browser.errors() == []
        assert browser.eval("document.getElementById('chart-section').hidden") is True
        pids = browser.eval(
            "[].map.call(document.querySelectorAll('#processes tbody tr'), "
            "r => [+r.getAttribute('data-pid'), +r.getAttribute('data-depth'), r.className])"
        )
        root = data["capture"]["processes"][0]["pid"]
        # Children in the order they started tracing, which a busy machine may swap.
        assert pids[0] == [root, 0, ""]
        assert sorted(pids[1:]) == sorted([[leaker, 1, ""], [victim, 1, "killed"]])
        killed_row = texts(browser, "#processes tbody tr.killed td")
        assert killed_row[0].endswith("killed") and "killed by SIGKILL" in killed_row[5]
        first = texts(browser, "#merged tbody tr:first-child td")
        assert first[1].endswith(f"tree_app.py:{line_of(script, '# SHARED')}")
        assert first[5] == "in 3 processes"
        # One line per process with numbered snapshots, a point per snapshot.
        drawn = browser.eval(
            "[].map.call(document.querySelectorAll('#proc-chart g.proc'), "
            "g => [+g.getAttribute('data-pid'), g.querySelectorAll('circle.ppt').length])"
        )
        by_pid = {p["pid"]: len(p["points"]) for p in data["capture"]["processes"]}
        assert sorted(drawn) == sorted(
            [pid, by_pid[pid]]
            for pid in by_pid
            if pid != root or data["capture"]["processes"][0]["numbered"]
        )
        choose(browser, "#merged-search", "no such file", "input")
        assert browser.eval("document.querySelectorAll('#merged tbody tr').length") == 0


HOSTILE = "</script><script>window.pwned=1</script><img src=x onerror=window.pwned=2>"


def test_hostile_capture_is_shown_as_text(tmp_path):
    """A capture from someone else: every string of its manifest and snapshots is text."""
    capture = tmp_path / "cap"
    capture.mkdir()
    raw_snapshot_file(capture / "11-1.snap", [(0, 4096, ((f"{HOSTILE}.py", 7),))])
    raw_snapshot_file(capture / "12-2.snap", [(0, 1024, ((f"{HOSTILE}.py", 7),))])
    records = [
        {
            "event": "start",
            "id": "11-1",
            "pid": 11,
            "ppid": 1,
            "time": 1.0,
            "argv": ["python3", HOSTILE],
        },
        {"event": "start", "id": "12-2", "pid": 12, "ppid": 11, "time": 2.0, "argv": [HOSTILE]},
        {"event": "snapshot", "id": "11-1", "pid": 11, "time": 3.0, "file": "11-1.snap", "n": None},
        {
            "event": "end",
            "id": "11-1",
            "pid": 11,
            "time": 3.0,
            "how": HOSTILE,
            "file": "11-1.snap",
            "name": HOSTILE,
        },
        {"event": "snapshot", "id": "12-2", "pid": 12, "time": 2.5, "file": "12-2.snap", "n": 1},
        {
            "event": "snapshot",
            "id": "12-2",
            "pid": 12,
            "time": 2.6,
            "file": "../../etc/passwd",
            "n": 2,
        },
        "not a record",
    ]
    (capture / "manifest.jsonl").write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n"
    )
    output = tmp_path / "hostile.html"
    data = _html_report.write_capture_report(str(capture), str(output))
    page = output.read_text()
    assert "</script><script>window.pwned" not in page
    assert "<img src=x" not in page
    processes = data["capture"]["processes"]
    assert [p["pid"] for p in processes] == [11, 12]
    assert processes[0]["role"] == HOSTILE and processes[1]["killed"]
    assert processes[1]["snapshot"] == "12-2.snap"  # the bad file name was not followed
    assert data["capture"]["notes"][0] == "2 unreadable manifest line(s)"
    assert data["capture"]["lines"] == [[0, 5120, 2, 2]]
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        return
    chromium_or_skip()
    with Browser(executable) as browser:
        browser.open(str(output))
        assert browser.eval("document.documentElement.getAttribute('data-ready')") == "1"
        assert browser.errors() == []
        assert browser.eval("window.pwned === undefined") is True
        assert browser.eval("document.querySelectorAll('img, #processes script').length") == 0
        cells = texts(browser, "#processes tbody tr td")
        assert any(HOSTILE in text for text in cells)
        assert texts(browser, "#merged tbody td.where")[0] == f"{HOSTILE}.py:7"


def test_capture_report_errors(tmp_path, series):
    _, _, paths = series
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "manifest.jsonl").write_text("")
    with pytest.raises(_html_report.ReportError, match="the manifest names no traced process"):
        _html_report.build_capture_data(str(empty))
    result = alloctrace_cli("report", str(empty), paths[0], "-o", str(tmp_path / "x.html"))
    assert result.returncode == 2
    assert "is a process-tree capture: report it alone" in result.stderr
    # Processes traced with different limits cannot be summed.
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    raw_snapshot_file(mixed / "1-1.snap", [(0, 10, (("a.py", 1),))], limit=3)
    raw_snapshot_file(mixed / "2-2.snap", [(0, 10, (("a.py", 1),))], limit=5)
    (mixed / "manifest.jsonl").write_text(
        "".join(
            json.dumps(r) + "\n"
            for pid in (1, 2)
            for r in (
                {"event": "start", "id": f"{pid}-{pid}", "pid": pid, "ppid": 0, "time": pid},
                {
                    "event": "end",
                    "id": f"{pid}-{pid}",
                    "pid": pid,
                    "time": pid + 1,
                    "file": f"{pid}-{pid}.snap",
                },
            )
        )
    )
    with pytest.raises(
        _html_report.ReportError, match=r"traceback_limit=3\) with .*traceback_limit=5"
    ):
        _html_report.build_capture_data(str(mixed))
