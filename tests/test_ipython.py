"""The ``%alloctrace`` and ``%%alloctrace`` magics, in an in-process IPython shell (no notebook
server)."""

import pytest

import alloctrace

IPython = pytest.importorskip("IPython")


@pytest.fixture
def shell(stopped_tracer):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "alloctrace")
    yield shell
    shell.user_ns.pop("kept", None)


def test_cell_magic_prints_and_returns_the_snapshot(shell, capsys):
    result = shell.run_cell(
        "%%alloctrace --limit 3\nkept = [bytes(1000) for _ in range(3000)]\n"
        "temp = bytes(5_000_000)\ndel temp\n"
    )
    assert result.success, result.error_in_exec
    snapshot = result.result
    assert isinstance(snapshot, alloctrace.Snapshot)
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    # The peak holds the 5 MB that the cell freed before its end; what is alive does not.
    assert first.startswith("%%alloctrace: peak 7.") and "MiB" in first, out
    assert "2.9 MiB still alive at the end of the cell" in first or "3.0 MiB still" in first
    assert "top 3 lines still alive:" in out or "top 1 lines still alive:" in out
    # At the peak, the freed 5 MB line comes first, with the kept list's line after it.
    at_peak = out[out.index("lines at the peak:") : out.index("lines still alive:")]
    assert ":2: size=4883 KiB, count=1" in at_peak.splitlines()[1], at_peak
    assert snapshot.peak.statistics("lineno")[0].size >= 5_000_000
    top = snapshot.statistics("lineno")[0]
    assert top.traceback[-1].lineno == 1 and top.size >= 3000 * 1000
    # The cell ran in the user's namespace, and tracing is off again.
    assert len(shell.user_ns["kept"]) == 3000
    assert not alloctrace.is_tracing()


def test_flamegraph_is_shown_inline(shell, monkeypatch, capsys):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    result = shell.run_cell("%%alloctrace --flamegraph\nkept = [bytes(100) for _ in range(100)]\n")
    assert result.success, result.error_in_exec
    (svg,) = shown
    assert isinstance(svg, IPython.display.SVG) and "<svg" in svg.data


def test_cell_errors(shell, capsys):
    result = shell.run_cell("%%alloctrace\nraise KeyError('in the cell')\n")
    assert isinstance(result.error_in_exec, KeyError)
    assert not alloctrace.is_tracing()
    result = shell.run_cell("%%alloctrace -n nope\npass\n")
    assert "%%alloctrace: argument -n/--frames" in capsys.readouterr().err
    shell.run_cell("%%alloctrace -n 0\npass\n")
    assert "-n/--frames from 1 to 65535" in capsys.readouterr().err
    alloctrace.start(1)
    try:
        shell.run_cell("%%alloctrace\npass\n")
    finally:
        alloctrace.stop()
    assert "alloctrace is already tracing" in capsys.readouterr().err


def test_n_is_frames_as_in_run_and_limit_is_lines(shell, capsys):
    shell.run_cell(
        "def inner():\n    return [bytes(500) for _ in range(200)]\n"
        "def outer():\n    return inner()\n"
    )
    result = shell.run_cell("%%alloctrace -n 3 --limit 1 --key traceback\nkept = outer()\n")
    assert result.success, result.error_in_exec
    assert result.result.traceback_limit == 3
    top = result.result.statistics("traceback")[0]
    assert len(top.traceback) == 3
    out = capsys.readouterr().out
    assert "top 1 lines still alive:" in out


def test_line_magic_traces_one_statement(shell, capsys):
    result = shell.run_cell("%alloctrace kept = [bytes(1000) for _ in range(2000)]\n")
    assert result.success, result.error_in_exec
    snapshot = result.result
    assert isinstance(snapshot, alloctrace.Snapshot) and snapshot.traceback_limit == 16
    assert len(shell.user_ns["kept"]) == 2000
    out = capsys.readouterr().out
    assert out.startswith("%alloctrace: peak ") and "still alive at the end of the statement" in out
    assert snapshot.statistics("lineno")[0].size >= 2000 * 1000
    assert not alloctrace.is_tracing()
    # Options come first; the statement is the rest of the line, as typed (it may hold "-").
    result = shell.run_cell("%alloctrace -n 2 --limit 0 kept = [-1] * 100_000\n")
    assert result.success, result.error_in_exec
    assert result.result.traceback_limit == 2
    assert shell.user_ns["kept"][0] == -1
    assert "top" not in capsys.readouterr().out


def test_line_magic_errors(shell, capsys):
    shell.run_cell("%alloctrace\n")
    assert "%alloctrace: a statement to trace is required" in capsys.readouterr().err
    shell.run_cell("%alloctrace --limit x y = 1\n")
    assert "%alloctrace: argument --limit" in capsys.readouterr().err
    result = shell.run_cell("%alloctrace raise KeyError('in the statement')\n")
    assert isinstance(result.error_in_exec, KeyError)
    assert not alloctrace.is_tracing()
