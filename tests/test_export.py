"""Exports of a real traced program: pprof (read back by ``go tool pprof``), folded stacks
(checked against ``statistics('traceback')``) and SVG flamegraphs (parsed as XML)."""

import gzip
import html
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import tracemalloc
import xml.etree.ElementTree as ET

import pytest

import alloctrace

PROGRAM = textwrap.dedent(
    """\
    import sys
    import alloctrace

    class Store:
        def fill(self):
            return [bytearray(100_000) for _ in range(20)]

    def make_strings():
        return ["x" * 50_000 for _ in range(10)]

    def main(before, after):
        only_me = [alloctrace.Filter(True, __file__)]
        store = Store()
        blocks = store.fill()
        alloctrace.take_snapshot().filter_traces(only_me).dump(before)
        strings = make_strings()
        alloctrace.take_snapshot().filter_traces(only_me).dump(after)
        return blocks, strings

    alloctrace.start(10)
    main(sys.argv[1], sys.argv[2])
    """
)
# The line of the bytearray allocation, and the function running it: a comprehension code
# object before 3.12, inlined into its function (PEP 709) from 3.12 on; qualified names
# from 3.11 on.
FILL_LINE = 6
FILL_FUNCTION = {
    (3, 9): "<listcomp>",
    (3, 10): "<listcomp>",
    (3, 11): "Store.fill.<locals>.<listcomp>",
}.get(sys.version_info[:2], "Store.fill")

SVG = "{http://www.w3.org/2000/svg}"
INFERNO = "{http://github.com/jonhoo/inferno}"
TOOLTIP = re.compile(r"^(.*) \(([\d,]+) bytes, [\d.]+%(?:; [+-]?[\d.]+%)?\)$")
FRAME = re.compile(r"^(?:(?P<function>.*) \()?(?P<file>.*):(?P<line>\d+)\)?$")


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    """(program path, snapshot file after fill, snapshot file after fill and strings)."""
    tmp = tmp_path_factory.mktemp("export")
    program = tmp / "prog.py"
    program.write_text(PROGRAM)
    before, after = tmp / "before.alct", tmp / "after.alct"
    subprocess.run([sys.executable, str(program), str(before), str(after)], check=True)
    return str(program), before, after


@pytest.fixture(scope="module")
def traced(dumped):
    """(program path, snapshot after fill, snapshot after fill and strings)."""
    program, before, after = dumped
    return program, alloctrace.Snapshot.load(before), alloctrace.Snapshot.load(after)


def read_collapsed(path):
    """{stack as ((function, file, line), ...) oldest first: size}."""
    out = {}
    for line in path.read_text().splitlines():
        stack, size = line.rsplit(" ", 1)
        frames = []
        for frame in stack.split(";"):
            m = FRAME.match(frame)
            frames.append((m["function"], m["file"], int(m["line"])))
        assert tuple(frames) not in out, f"stack repeated: {line}"
        out[tuple(frames)] = int(size)
    return out


def test_collapsed_matches_statistics(traced, tmp_path):
    program, _, snapshot = traced
    out = tmp_path / "stacks.txt"
    snapshot.to_collapsed(out)
    stacks = read_collapsed(out)
    by_frames = {
        tuple((file, line) for _, file, line in stack): size for stack, size in stacks.items()
    }
    expected = {
        tuple((frame.filename, frame.lineno) for frame in stat.traceback): stat.size
        for stat in snapshot.statistics("traceback")
    }
    assert by_frames == expected
    assert len(stacks) == len(expected)
    # Lines come sorted, and every frame names its function.
    lines = out.read_text().splitlines()
    assert lines == sorted(lines)
    assert all(function for stack in stacks for function, _, _ in stack)
    # The comprehension's own stack (on 3.9 and 3.10 its frame object may be another one
    # ending on the same line, in the calling function: see test_pprof_opens_in_go_tool_pprof).
    fill = [stack for stack in stacks if stack[-1] == (FILL_FUNCTION, program, FILL_LINE)]
    assert len(fill) == 1
    assert fill[0][0][0] == "<module>"
    assert stacks[fill[0]] >= 20 * 100_000


def test_function_names_survive_filter_and_dump(traced, tmp_path):
    _, _, snapshot = traced
    out1, out2 = tmp_path / "a.txt", tmp_path / "b.txt"
    snapshot.to_collapsed(out1)
    snapshot.dump(tmp_path / "again.alct")
    again = alloctrace.Snapshot.load(tmp_path / "again.alct")
    again.filter_traces([alloctrace.Filter(True, "*")]).to_collapsed(out2)
    assert out1.read_text() == out2.read_text()


DATA = pathlib.Path(__file__).parent / "data"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # Written by alloctrace before function names were recorded: they load as unknown.
        ("written-before-function-names.alct", "<stdin>:7;<stdin>:6;<stdin>:6 10698"),
        # Written with them (by Python 3.11); any reader version shows the stored names.
        (
            "with-function-names.alct",
            "<module> (<stdin>:4);f (<stdin>:3);f.<locals>.<listcomp> (<stdin>:3) 10698",
        ),
    ],
)
def test_files_with_and_without_function_names(tmp_path, name, expected):
    snapshot = alloctrace.Snapshot.load(DATA / name)
    out = tmp_path / "stacks.txt"
    snapshot.to_collapsed(out)
    lines = out.read_text().splitlines()
    assert expected in lines
    assert len(lines) == len(snapshot.statistics("traceback")) == 3


def test_raw_snapshots_have_no_function_names(tmp_path):
    traces = [(0, 10, (("b.py", 2), ("a.py", 1)), 2), (0, 5, (("a.py", 1),), 1)]
    out = tmp_path / "raw.txt"
    alloctrace.Snapshot(traces, 2).to_collapsed(out)
    assert out.read_text() == "a.py:1 5\na.py:1;b.py:2 10\n"


def go_pprof(*args):
    if shutil.which("go") is None:
        pytest.skip("go is not installed (Debian: apt-get install golang-go); cannot run pprof")
    result = subprocess.run(
        ["go", "tool", "pprof", *args], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_pprof_opens_in_go_tool_pprof(traced, tmp_path):
    program, _, snapshot = traced
    out = tmp_path / "heap.pb.gz"
    snapshot.to_pprof(out)
    assert gzip.decompress(out.read_bytes())
    size = sum(
        stat.size
        for stat in snapshot.statistics("lineno")
        if (stat.traceback[0].filename, stat.traceback[0].lineno) == (program, FILL_LINE)
    )
    text = go_pprof("-top", "-lines", "-unit=B", str(out))
    assert "Type: inuse_space" in text
    rows = [line.split() for line in text.splitlines() if re.match(r"^\s*\d+B\s", line)]
    # flat flat% sum% cum cum% function file:line. pprof's rows are per function and line:
    # on 3.9 and 3.10 the frame object of the comprehension's call is allocated on the same
    # line by the calling function (when CPython's frame free list has none), a row of its own.
    top = rows[0]
    assert " ".join(top[5:]) == f"{FILL_FUNCTION} {program}:{FILL_LINE}"
    on_the_line = [row for row in rows if row[-1] == f"{program}:{FILL_LINE}"]
    assert sum(int(row[0][:-1]) for row in on_the_line) == size
    # Objects too, by the other sample type.
    text = go_pprof("-top", "-sample_index=inuse_objects", str(out))
    assert "Type: inuse_objects" in text


def frames_of(svg_path):
    """The flamegraph's title and its frames as (name, bytes from the tooltip, fg:w)."""
    root = ET.parse(svg_path).getroot()
    assert root.tag == f"{SVG}svg"
    title = root.find(f".//{SVG}text[@id='title']").text
    frames = []
    for g in root.iter(f"{SVG}g"):
        tooltip = g.find(f"{SVG}title")
        if tooltip is None:
            continue
        rects = g.findall(f"{SVG}rect")
        assert len(rects) == 1
        m = TOOLTIP.match(tooltip.text)
        assert m, tooltip.text
        frames.append((m[1], int(m[2].replace(",", "")), int(rects[0].get(f"{INFERNO}w"))))
    return title, frames


def prefixes(stacks):
    """{(frame label, ...) oldest first: bytes} for every prefix of the folded stacks."""
    out = {}
    for stack, size in stacks.items():
        labels = tuple(f"{fn} ({file}:{line})" for fn, file, line in stack)
        for i in range(1, len(labels) + 1):
            out[labels[:i]] = out.get(labels[:i], 0) + size
    return out


def test_flamegraph_structure(traced, tmp_path):
    _, _, snapshot = traced
    snapshot.to_collapsed(tmp_path / "stacks.txt")
    expected = prefixes(read_collapsed(tmp_path / "stacks.txt"))
    total = sum(stat.size for stat in snapshot.statistics("traceback"))
    out = tmp_path / "flame.svg"
    snapshot.to_flamegraph(out, title="Demo <heap>")
    title, frames = frames_of(out)
    assert title == "Demo <heap>"
    assert frames[0] == ("all", total, total) or ("all", total, total) in frames
    drawn = [f for f in frames if f[0] != "all"]
    # Every drawn frame is a stack prefix with its exact size; every prefix wider than
    # 1% of the picture is drawn (inferno leaves out frames under 0.1 pixel).
    by_leaf = {}
    for labels, size in expected.items():
        by_leaf.setdefault(labels[-1], []).append(size)
    for name, size, width in drawn:
        assert size == width
        assert size in by_leaf[name], (name, size)
    big = sorted((labels[-1], size) for labels, size in expected.items() if size * 100 > total)
    assert sorted((name, size) for name, size, _ in drawn if size * 100 > total) == big
    assert len(drawn) <= len(expected)


def test_differential_flamegraph(traced, tmp_path):
    _, before, after = traced
    out = tmp_path / "growth.svg"
    after.to_flamegraph(out, base=before)
    title, frames = frames_of(out)
    assert title == "Memory growth by stack"
    titles = [html.unescape(t) for t in re.findall(r"<title>([^<]*)</title>", out.read_text())]
    # The change shows on the frames that allocated: the strings' line grew (by all of its
    # size), the bytearrays' line did not change.
    strings = [t for t in titles if re.search(r":9\) \(500,\d{3} bytes", t)]
    assert any(re.search(r"bytes, ([\d.]+)%; \+\1%\)$", t) for t in strings), strings
    blocks = [t for t in titles if f":{FILL_LINE}) (" in t]
    assert blocks and all(t.endswith("; 0.00%)") for t in blocks), blocks
    # A tracemalloc snapshot is accepted as the base.
    base = tracemalloc.Snapshot([], 1)
    after.to_flamegraph(tmp_path / "vs_empty.svg", base=base)


def test_export_errors(traced, tmp_path):
    _, _, snapshot = traced
    with pytest.raises(ValueError, match="no traced memory"):
        alloctrace.Snapshot([], 1).to_flamegraph(tmp_path / "empty.svg")
    with pytest.raises(TypeError, match="title must be a str"):
        snapshot.to_flamegraph(tmp_path / "x.svg", title=3)
    with pytest.raises(TypeError, match="base must be a Snapshot"):
        snapshot.to_flamegraph(tmp_path / "x.svg", base="old.alct")
    with pytest.raises(OSError):
        snapshot.to_pprof(tmp_path / "missing" / "x.pb.gz")
    assert list(tmp_path.iterdir()) == []


def test_bytes_and_path_like_filenames(traced, tmp_path):
    _, _, snapshot = traced
    snapshot.to_collapsed(tmp_path / "a.txt")
    snapshot.to_collapsed(bytes(tmp_path / "b.txt"))
    snapshot.to_pprof(str(tmp_path / "c.pb.gz"))
    snapshot.to_flamegraph(bytes(tmp_path / "d.svg"))
    assert (tmp_path / "a.txt").read_text() == (tmp_path / "b.txt").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt", "c.pb.gz", "d.svg"]


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "alloctrace", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_export_and_flamegraph(dumped, tmp_path):
    _, before, after = dumped
    expected = tmp_path / "expected.txt"
    alloctrace.Snapshot.load(after).to_collapsed(expected)
    result = cli("export", str(after), "--format", "collapsed", "-o", str(tmp_path / "c.txt"))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert (tmp_path / "c.txt").read_text() == expected.read_text()
    # Filters apply as in 'stats': here every block comes from the program, none from json.
    result = cli(
        "export",
        str(after),
        "--format",
        "collapsed",
        "--include",
        "*json*",
        "-o",
        str(tmp_path / "none.txt"),
    )
    assert result.returncode == 0 and (tmp_path / "none.txt").read_text() == ""
    assert "--include '*json*' matches no file" in result.stderr

    result = cli("export", str(after), "--format", "pprof", "-o", str(tmp_path / "p.pb.gz"))
    assert result.returncode == 0, result.stderr
    assert gzip.decompress((tmp_path / "p.pb.gz").read_bytes())

    result = cli("flamegraph", str(after), "-o", str(tmp_path / "f.svg"), "--title", "CLI")
    assert result.returncode == 0, result.stderr
    assert frames_of(tmp_path / "f.svg")[0] == "CLI"
    result = cli("flamegraph", "--diff", str(before), str(after), "-o", str(tmp_path / "d.svg"))
    assert result.returncode == 0, result.stderr
    assert frames_of(tmp_path / "d.svg")[0] == "Memory growth by stack"


def test_outputs_have_default_names(dumped, tmp_path):
    """Without -o, each command writes the snapshot's name with its format's ending in the
    current directory, and says so on stderr."""
    _, before, after = dumped
    snap_before, snap_after = tmp_path / "before.snap", tmp_path / "after.snap"
    snap_before.write_bytes(before.read_bytes())
    snap_after.write_bytes(after.read_bytes())
    work = tmp_path / "work"
    work.mkdir()
    cases = [
        (["export", str(snap_after), "--format", "pprof"], "after.pb.gz"),
        (["export", str(snap_after), "--format", "folded"], "after.folded"),
        (["flamegraph", str(snap_after)], "after.svg"),
        (["flamegraph", "--diff", str(snap_before), str(snap_after)], "after-diff.svg"),
        (["report", str(snap_before), str(snap_after)], "before.html"),
        # A directory stands for its *.snap files, a quoted pattern for its matches.
        (["report", str(tmp_path)], f"{tmp_path.name}.html"),
        (["report", str(tmp_path / "*.snap")], f"{tmp_path.name}.html"),
    ]
    for args, name in cases:
        result = subprocess.run(
            [sys.executable, "-m", "alloctrace", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=work,
        )
        assert result.returncode == 0, (args, result.stderr)
        assert f"alloctrace: writing {name} (choose another name with -o)" in result.stderr
        assert (work / name).stat().st_size > 0, args
        (work / name).unlink()
    # A file that cannot be read is named once.
    result = cli("report", str(tmp_path / "none.snap"), "-o", str(work / "r.html"))
    assert result.returncode == 1
    assert result.stderr.count("cannot read") == 1, result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "{after}", "-o", "{tmp}/x"], "--format"),
        (["export", "{after}", "--format", "svg", "-o", "{tmp}/x"], "invalid choice: 'svg'"),
        (["export", "{tmp}/missing.alct", "--format", "pprof", "-o", "{tmp}/x"], "missing.alct"),
        (["export", "{program}", "--format", "pprof", "-o", "{tmp}/x"], "not a readable"),
        (["export", "{after}", "--format", "pprof", "-o", "{tmp}/no/x"], "cannot write"),
        (["flamegraph", "-o", "{tmp}/x.svg"], "either one snapshot FILE or --diff"),
        (["flamegraph", "{after}", "--diff", "{before}", "{after}", "-o", "{tmp}/x"], "either"),
        (
            ["flamegraph", "{after}", "--include", "nothing", "-o", "{tmp}/x.svg"],
            "--include 'nothing' matches no file",
        ),
    ],
)
def test_cli_export_errors(dumped, tmp_path, args, message):
    program, before, after = dumped
    values = {"program": program, "before": before, "after": after, "tmp": tmp_path}
    result = cli(*(a.format(**values) for a in args))
    assert result.returncode != 0
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("alloctrace: error: ")
    assert message in result.stderr
    assert list(tmp_path.iterdir()) == []
