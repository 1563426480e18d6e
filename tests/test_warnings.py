"""Warnings about an object (``ResourceWarning``) say where it was allocated while alloctrace
traces, in the words the standard formatter uses while tracemalloc does (see
``alloctrace._allocation_lines_in_warnings``)."""

import textwrap
import warnings

import pytest

import alloctrace
from subproc import run_python

HINT = "ResourceWarning: Enable tracemalloc to get the object allocation traceback\n"

SCRIPT = textwrap.dedent(
    """\
    import socket

    def make():
        return socket.socket()

    def leak():
        s = make()
        del s

    leak()
    """
)


@pytest.mark.parametrize("nframe", [1, 5])
def test_resource_warning_reads_as_under_tracemalloc(tmp_path, nframe):
    script = tmp_path / "leaky.py"
    script.write_text(SCRIPT)
    seen = {}
    for tracer in ("tracemalloc", "alloctrace"):
        result = run_python([f"-X{tracer}={nframe}", "-Walways", str(script)])
        assert result.returncode == 0, result.stderr
        seen[tracer] = result.stderr
    assert "Object allocated at (most recent call last):" in seen["tracemalloc"]
    assert seen["alloctrace"] == seen["tracemalloc"]
    assert seen["alloctrace"].count(", lineno ") == min(nframe, 3)


def formatted(obj):
    message = warnings.WarningMessage("unclosed", ResourceWarning, "f.py", 1, source=obj)
    return warnings._formatwarnmsg(message)


class Thing:
    pass


def test_lines_only_while_tracing_and_only_for_traced_objects():
    before = Thing()
    assert alloctrace.is_tracing() is False
    # Not tracing: the standard hint stays, since tracemalloc could still be enabled.
    assert formatted(before).endswith(HINT)
    alloctrace.start(2)
    try:
        during = Thing()
        during_line = formatted(during)
        assert "Object allocated at (most recent call last):\n" in during_line
        assert f'  File "{__file__}", lineno ' in during_line
        assert "    during = Thing()\n" in during_line
        # Allocated before tracing started: neither lines nor the hint, as when tracemalloc
        # traces and has no traceback for the object.
        untraced = formatted(before)
        assert HINT not in untraced and "Object allocated" not in untraced
        assert untraced == "f.py:1: ResourceWarning: unclosed\n"
    finally:
        alloctrace.stop()
    assert formatted(during).endswith(HINT)


def test_warning_without_object_and_replaced_formatter_are_untouched(monkeypatch):
    alloctrace.start(1)
    try:
        plain = warnings.WarningMessage("plain", UserWarning, "f.py", 1)
        assert warnings._formatwarnmsg(plain) == "f.py:1: UserWarning: plain\n"
        monkeypatch.setattr(warnings, "formatwarning", lambda *args, **kwargs: "mine\n")
        assert formatted(Thing()) == "mine\n"
    finally:
        alloctrace.stop()
