"""Same per-line answers as tracemalloc on real programs: workloads built on PyPI packages
(tests/workloads/) run under each tracer at one frame, in separate processes, and their
``statistics('lineno')`` are compared.

The measure is the share of traced bytes on other lines than tracemalloc's: half the sum of
per-line differences, over tracemalloc's total. Free-list reuse that is not re-attributed
moves whole objects to other lines (issue 13: 17.9% on docutils); the same tracer run twice
agrees to well under 1%.
"""

import json
import os
import sys

import pytest

from alloctrace import _native
from subproc import run_python

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = os.path.join(HERE, "workloads")
MAX_MOVED = 0.02


def per_line(tracer, workload, nframe=1):
    proc = run_python(
        [
            os.path.join(WORKLOADS, "driver.py"),
            tracer,
            os.path.join(WORKLOADS, workload),
            str(nframe),
        ],
        PYTHONHASHSEED="0",
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def moved_share(ours, theirs):
    lines = ours.keys() | theirs.keys()
    moved = sum(abs(ours.get(k, 0) - theirs.get(k, 0)) for k in lines) / 2
    return moved / max(sum(theirs.values()), 1)


# Where alloctrace cannot see object creations (a static 3.9 or 3.10 that inlined
# _Py_NewReference, docs/freelists.md), free list reuse moves whole objects to other lines:
# 3-19% of these workloads' bytes on Debian's 3.11 before its inlined copies were patched.
# networkx's figures agree even then (0.06% measured there), so it is not marked.
NO_FREELIST = pytest.mark.xfail(
    _native._freelist_mechanism() is None,
    reason="no way to re-attribute free-list reuse on this interpreter",
    strict=True,
)


@pytest.mark.parametrize(
    "workload",
    [
        pytest.param("docutils_html.py", marks=NO_FREELIST),
        pytest.param("jinja2_render.py", marks=NO_FREELIST),
        pytest.param("markdown_tree.py", marks=NO_FREELIST),
        "networkx_graph.py",
        pytest.param("pygments_tokens.py", marks=NO_FREELIST),
        pytest.param("sympy_algebra.py", marks=NO_FREELIST),
    ],
)
def test_per_line_sizes_match_tracemalloc(workload):
    theirs = per_line("tracemalloc", workload)
    ours = per_line("alloctrace", workload)
    share = moved_share(ours, theirs)
    worst = sorted(
        ((ours.get(k, 0) - theirs.get(k, 0), k) for k in ours.keys() | theirs.keys()),
        key=lambda d: -abs(d[0]),
    )[:5]
    print(f"{workload}: {share:.2%} of {sum(theirs.values())} bytes moved", file=sys.stderr)
    assert share <= MAX_MOVED, f"{share:.2%} of the bytes on other lines; worst: {worst}"


@pytest.mark.parametrize(
    "workload",
    [
        pytest.param("docutils_html.py", marks=NO_FREELIST),
        pytest.param("markdown_tree.py", marks=NO_FREELIST),
        "networkx_graph.py",
        # 5.33% where object creations cannot be seen (Debian's static 3.11 before its
        # inlined copies of _Py_NewReference were patched).
        pytest.param("pygments_tokens.py", marks=NO_FREELIST),
    ],
)
def test_per_traceback_sizes_at_25_frames_match_tracemalloc(workload):
    """Whole stacks, not only lines: each traceback's size at 25 frames. Measured on
    2026-11-26 (3.9 / 3.11 / 3.13): docutils 0.38% / 0.57% / 0.40% moved, markdown 0.03% /
    0.17% / 0.12%, networkx and pygments under 0.02%. Left out: sympy, whose per-traceback
    figures move 4-8.5% between runs of the same build (its caches), and jinja2 (1.1% on 3.11,
    too near the bound to be a stable test)."""
    theirs = per_line("tracemalloc", workload, nframe=25)
    ours = per_line("alloctrace", workload, nframe=25)
    assert sum(theirs.values()) > 0
    share = moved_share(ours, theirs)
    assert share <= MAX_MOVED, f"{share:.2%} of the bytes under other tracebacks"


def test_moved_share_measure():
    # (ours, theirs, expected share)
    cases = [
        ({"a:1": 100}, {"a:1": 100}, 0.0),
        ({"a:1": 100}, {"a:2": 100}, 1.0),
        ({"a:1": 90, "a:2": 10}, {"a:1": 100}, 0.1),
        ({}, {}, 0.0),
    ]
    for ours, theirs, expected in cases:
        assert moved_share(ours, theirs) == pytest.approx(expected)
