"""The ``%%alloctrace`` cell magic, in an in-process IPython shell (no notebook server)."""

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
        "%%alloctrace -n 3\nkept = [bytes(1000) for _ in range(3000)]\ntemp = bytes(5_000_000)\n"
        "del temp\n"
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
    assert "%%alloctrace: argument -n" in capsys.readouterr().err
    alloctrace.start(1)
    try:
        shell.run_cell("%%alloctrace\npass\n")
    finally:
        alloctrace.stop()
    assert "alloctrace is already tracing" in capsys.readouterr().err
