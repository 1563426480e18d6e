"""Turning the parts' measurements into the one markdown table the README quotes.

Every row puts tracemalloc and alloctrace side by side, with the target the project set for it
and PASS or MISS, so a reader sees at once where alloctrace stands.  A missing alloctrace column
(not importable, or a child that failed) is reported as such, never as a number.
"""

from __future__ import annotations

from typing import Any

import childproc
import tracers

#: Targets from the issues (performance round two for the overhead rows); see the module
#: docstring of each part for what is measured.
GEOMEAN_MAX = {1: 1.3, 25: 1.7}
#: alloctrace's sampled mode (default 512 KiB interval, nframe 64): the production target.
SAMPLED_GEOMEAN_MAX = 1.05
#: Native mode (start(1, native=True)) over the same benchmarks.
NATIVE_GEOMEAN_MAX = 1.6
WORST_MAX_NFRAME1 = 2.0
OVERHEAD_CUT_MIN = 4.0
BYTES_PER_BLOCK_MAX = 24.0
LONG_FUNCTION_MAX_EXTRA = 0.20
SNAPSHOT_SPEEDUP_MIN = 30.0
DUMP_SIZE_MAX_RATIO = 0.5
#: "A few seconds" for take_snapshot(objects=True) on a million live objects.
OBJECTS_SNAPSHOT_MAX_SECONDS = 5.0
#: Below this overhead (ratio - 1) tracemalloc's cost is within run-to-run noise, so the
#: "4x less overhead" comparison on that benchmark would compare noise with noise.
NOISE_FLOOR = 0.05

HEADER = (
    "| part | case | nframe | tracemalloc | alloctrace | alloctrace vs tracemalloc "
    "| target | result |\n|---|---|---|---|---|---|---|---|"
)


def _seconds(value: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def _size(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def _speedup(ratio: float | None) -> str:
    """Describe tracemalloc time / alloctrace time in words that stay readable below 1."""
    if ratio is None:
        return "—"
    if ratio >= 1:
        return f"{ratio:.{0 if ratio >= 10 else 1}f}x faster"
    return f"{1 / ratio:.1f}x slower"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "**MISS**"


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def overhead_rows(part: dict[str, Any], have_at: bool) -> list[str]:
    """Part 1 rows: slowdown per benchmark and depth, then geometric means."""
    rows = []
    ratios: dict[tuple[str, int], list[float]] = {}
    bounded_means: set[tuple[str, int]] = set()
    for nframe in part["nframes"]:
        tm_spec, at_spec = f"tracemalloc:{nframe}", f"alloctrace:{nframe}"
        for entry in part["rows"]:
            secs = entry["seconds"]
            base = secs.get("none")
            if base is None:
                continue
            tm = secs[tm_spec] / base if tm_spec in secs else None
            at = secs[at_spec] / base if at_spec in secs else None
            # ">=": a value was cut short by the time budget, so the ratio is a lower bound.
            bounded = set(entry.get("lower_bound", ()))
            tm_mark = "≥" if tm_spec in bounded else ""
            at_mark = "≥" if at_spec in bounded else ""
            if tm is not None:
                ratios.setdefault(("tracemalloc", nframe), []).append(tm)
            if at is not None:
                ratios.setdefault(("alloctrace", nframe), []).append(at)
            bounded_means.update(
                (name, nframe)
                for name, mark in (("tracemalloc", tm_mark), ("alloctrace", at_mark))
                if mark
            )
            case = f"{entry['workload']} (untraced {_seconds(base)})"
            target = f"overhead ≥{OVERHEAD_CUT_MIN:g}x smaller"
            if nframe == 1:
                target += f", slowdown ≤{WORST_MAX_NFRAME1:g}x"
            versus, result = "—", "not measured" if not have_at else "failed"
            if tm is not None and at is not None:
                if tm - 1 < NOISE_FLOOR:
                    versus = "tracemalloc overhead within noise"
                    ok = nframe != 1 or at <= WORST_MAX_NFRAME1
                    result = _verdict(ok) if nframe == 1 else "n/a"
                else:
                    cut = (tm - 1) / (at - 1) if at - 1 > 0 else float("inf")
                    versus = (
                        "alloctrace: no measurable overhead"
                        if cut == float("inf")
                        else f"overhead {tm_mark}{cut:.1f}x smaller"
                    )
                    ok = cut >= OVERHEAD_CUT_MIN and (nframe != 1 or at <= WORST_MAX_NFRAME1)
                    result = _verdict(ok and not at_mark)
                    if tm_mark and not ok and not at_mark:
                        versus, result = "unknown: tracemalloc run cut short", "n/a"
            rows.append(
                _row(
                    "overhead",
                    case,
                    str(nframe),
                    f"{tm_mark}{tm:.2f}x" if tm is not None else "failed",
                    f"{at_mark}{at:.2f}x" if at is not None else "—",
                    versus,
                    target,
                    result,
                )
            )
    for nframe in part["nframes"]:
        tm_list = ratios.get(("tracemalloc", nframe), [])
        at_list = ratios.get(("alloctrace", nframe), [])
        tm = childproc.geomean(tm_list) if tm_list else None
        at = childproc.geomean(at_list) if at_list else None
        result = _verdict(at <= GEOMEAN_MAX[nframe]) if at is not None else "not measured"
        tm_mark = "≥" if ("tracemalloc", nframe) in bounded_means else ""
        at_mark = "≥" if ("alloctrace", nframe) in bounded_means else ""
        rows.append(
            _row(
                "overhead",
                f"**geometric mean** of {len(tm_list)}",
                str(nframe),
                f"{tm_mark}{tm:.2f}x" if tm is not None else "—",
                f"{at_mark}{at:.2f}x" if at is not None else "—",
                f"overhead {tm_mark}{(tm - 1) / (at - 1):.1f}x smaller"
                if tm is not None and at is not None and at > 1
                else "—",
                f"slowdown ≤{GEOMEAN_MAX[nframe]:g}x",
                result,
            )
        )
    rows += sampled_overhead_rows(part, have_at)
    return rows


def _interval(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def sampled_overhead_rows(part: dict[str, Any], have_at: bool) -> list[str]:
    """Rows of alloctrace's sampled mode: per benchmark, then the geometric mean against its
    target. tracemalloc has no sampled mode, so its column shows its cheapest measured
    setting (the lowest nframe) for comparison."""
    rows = []
    tm_nframe = min(part["nframes"]) if part["nframes"] else None
    tm_spec = f"tracemalloc:{tm_nframe}"
    for spec, label in _sampled_modes(part):
        at_list, tm_list, bounded, tm_bounded = [], [], False, False
        for entry in part["rows"]:
            secs = entry["seconds"]
            base = secs.get("none")
            if base is None:
                continue
            at = secs[spec] / base if spec in secs else None
            tm = secs[tm_spec] / base if tm_spec in secs else None
            marked = spec in set(entry.get("lower_bound", ()))
            tm_marked = tm_spec in set(entry.get("lower_bound", ()))
            bounded = bounded or marked
            tm_bounded = tm_bounded or tm_marked
            if at is not None:
                at_list.append(at)
            if tm is not None:
                tm_list.append(tm)
            rows.append(
                _row(
                    "overhead",
                    f"{entry['workload']} (untraced {_seconds(base)})",
                    label,
                    f"{'≥' if tm_marked else ''}{tm:.2f}x (nframe {tm_nframe})"
                    if tm is not None
                    else "—",
                    f"{'≥' if marked else ''}{at:.2f}x" if at is not None else "—",
                    "—",
                    "—",
                    "" if at is not None else ("not measured" if not have_at else "failed"),
                )
            )
        at = childproc.geomean(at_list) if at_list else None
        tm = childproc.geomean(tm_list) if tm_list else None
        tm_mark = "≥" if tm_bounded else ""
        if tm is None or at is None:
            versus = "—"
        elif at - 1 < NOISE_FLOOR:
            # A ratio of two overheads, one of them within noise, would be noise too.
            versus = "alloctrace overhead within noise"
        else:
            versus = f"overhead {tm_mark}{(tm - 1) / (at - 1):.1f}x smaller"
        rows.append(
            _row(
                "overhead",
                f"**geometric mean** of {len(at_list)}, sampled",
                label,
                f"{tm_mark}{tm:.2f}x (nframe {tm_nframe})" if tm is not None else "—",
                f"{'≥' if bounded else ''}{at:.2f}x" if at is not None else "—",
                versus,
                f"slowdown ≤{SAMPLED_GEOMEAN_MAX:g}x",
                _verdict(at <= SAMPLED_GEOMEAN_MAX and not bounded)
                if at is not None
                else "not measured",
            )
        )
    return rows


def _sampled_modes(part: dict[str, Any]) -> list[tuple[str, str]]:
    """(mode, row label) of each sampled mode the overhead part ran."""
    modes = []
    for nframe, interval, *rest in part.get("sampled", []):
        reattribute = rest[0] if rest else True
        spec = tracers.mode("alloctrace", nframe, interval, reattribute=reattribute)
        label = f"{nframe}, sampled {_interval(interval)}"
        modes.append((spec, label if reattribute else label + ", reattribute=False"))
    return modes


def round_spread(part: dict[str, Any]) -> list[str]:
    """How far apart whole rounds land: each round's own geometric mean of traced / untraced
    for every alloctrace mode with a target, over the benchmarks of the table's mean. A
    target met by the table's mean but not by every round is met within the machine's noise.
    A mode with a value cut short anywhere has its rounds marked as lower bounds (≥). Nothing
    for a single round, or for results written before rounds were kept apart."""
    rounds = part.get("settings", {}).get("rounds", 1)
    rows = [entry for entry in part["rows"] if "per_round" in entry]
    if rounds < 2 or not rows:
        return []
    figures = []
    exact = [(f"alloctrace:{nframe}", f"nframe {nframe}") for nframe in part["nframes"]]
    for spec, label in exact + _sampled_modes(part):
        measured = [e for e in rows if spec in e["seconds"] and "none" in e["seconds"]]
        if not measured:
            continue
        mark = "≥" if any(spec in e.get("lower_bound", ()) for e in measured) else ""
        means = []
        for r in range(rounds):
            ratios = [
                e["per_round"][spec][r] / e["per_round"]["none"][r]
                for e in measured
                if e["per_round"][spec][r] is not None and e["per_round"]["none"][r] is not None
            ]
            # A round missing a benchmark (a failed child) would be a mean over other work.
            means.append(
                f"{mark}{childproc.geomean(ratios):.2f}x" if len(ratios) == len(measured) else "—"
            )
        figures.append(f"{label}: {', '.join(means)}")
    if not figures:
        return []
    return [
        "",
        f"- Spread: the geometric mean of each of the {rounds} rounds alone (traced / untraced "
        "in the same round, over the benchmarks of the table's mean), alloctrace "
        + "; ".join(figures),
    ]


#: Column titles of the side-by-side modes (run.py --native / --memray).
SIDE_TITLES = {
    "tracemalloc:1": "tracemalloc 1",
    "alloctrace:1": "alloctrace 1",
    "alloctrace:1+native": "alloctrace 1, native",
    "alloctrace:1+noreattribute": "alloctrace 1, reattribute=False",
    "memray": "memray",
    "memray+python-allocators": "memray --trace-python-allocators",
    "memray+native": "memray --native",
}


def side_by_side(part: dict[str, Any]) -> list[str]:
    """A second table when the overhead part ran side-by-side modes: every tracer at one
    frame (memray keeps whole stacks) per benchmark, slowdown against untraced, then the
    geometric means and native mode's target."""
    extra = part.get("extra", [])
    if not extra:
        return []
    specs = [spec for spec in ("tracemalloc:1", "alloctrace:1") if spec in part["modes"]]
    specs += extra
    lines = [
        "",
        "Side by side at one frame (memray records whole stacks; its figures include writing "
        "its capture file, as `memray run` does):",
        "",
        "| benchmark | untraced | " + " | ".join(SIDE_TITLES.get(s, s) for s in specs) + " |",
        "|---|---|" + "---|" * len(specs),
    ]
    ratios: dict[str, list[float]] = {spec: [] for spec in specs}
    complete = 0
    for entry in part["rows"]:
        secs, bounded = entry["seconds"], set(entry.get("lower_bound", ()))
        base = secs.get("none")
        if base is None:
            continue
        cells = []
        if all(spec in secs for spec in specs):
            complete += 1
        for spec in specs:
            if spec not in secs:
                cells.append("failed")
                continue
            ratio = secs[spec] / base
            if all(other in secs for other in specs):
                ratios[spec].append(ratio)
            cells.append(f"{'≥' if spec in bounded else ''}{ratio:.2f}x")
        lines.append(_row(entry["workload"], _seconds(base), *cells))
    means = [
        f"**{childproc.geomean(ratios[spec]):.2f}x**" if ratios[spec] else "—" for spec in specs
    ]
    lines.append(_row(f"**geometric mean** of {complete}", "", *means))
    for spec in part.get("extra_absent", []):
        lines.append(f"- {SIDE_TITLES.get(spec, spec)}: not measured (tracer not importable)")
    native = "alloctrace:1+native"
    if ratios.get(native):
        mean = childproc.geomean(ratios[native])
        lines.append(
            f"- Native mode: geometric mean {mean:.2f}x, target ≤{NATIVE_GEOMEAN_MAX:g}x: "
            f"{_verdict(mean <= NATIVE_GEOMEAN_MAX)} (means over the {complete} benchmarks every "
            "column measured)"
        )
    fidelity = "alloctrace:1+noreattribute"
    if ratios.get(fidelity) and ratios.get("alloctrace:1"):
        lines.append(_fidelity_line(ratios["alloctrace:1"], ratios[fidelity], complete))
    return lines


def _fidelity_line(default: list[float], without: list[float], complete: int) -> str:
    """What re-attributing reused objects costs against the one-frame targets: the geometric
    mean and the rows over 2x, with it (the default) and without it, over the same rows."""
    target = GEOMEAN_MAX[1]

    def summary(ratios: list[float]) -> str:
        mean = childproc.geomean(ratios)
        over = sum(r > WORST_MAX_NFRAME1 for r in ratios)
        return (
            f"{mean:.2f}x ({_verdict(mean <= target)} against ≤{target:g}x), "
            f"{over} row{'s' if over != 1 else ''} over {WORST_MAX_NFRAME1:g}x"
        )

    return (
        f"- Re-attribution of objects reused from free lists, over the {complete} benchmarks "
        f"every column measured: with it (the default) {summary(default)}; without it "
        f"(`reattribute=False`) {summary(without)}"
    )


HOOK_CASES = {
    "shallow": "alloc+free, shallow stack",
    "deep": "alloc+free, 50 frames deeper",
    "long": "alloc+free, after 3,000 lines",
}


def hook_rows(part: dict[str, Any], have_at: bool) -> list[str]:
    """Part 2 rows: nanoseconds added per allocation+free pair."""
    ns = part["ns_per_iteration"]
    base = ns.get("none", {})
    rows = []
    for workload, label in HOOK_CASES.items():
        if workload not in base:
            continue
        for nframe in (1, 25, 100):
            tm = ns.get(f"tracemalloc:{nframe}", {}).get(workload)
            at = ns.get(f"alloctrace:{nframe}", {}).get(workload)
            tm_add = tm - base[workload] if tm is not None else None
            at_add = at - base[workload] if at is not None else None
            versus = (
                f"{tm_add / at_add:.1f}x less"
                if tm_add is not None and at_add is not None and at_add > 0
                else "—"
            )
            target, result = "—", ""
            if workload == "long":
                target = f"≤{LONG_FUNCTION_MAX_EXTRA:.0%} over shallow"
                shallow = ns.get(f"alloctrace:{nframe}", {}).get("shallow")
                if at_add is not None and shallow is not None:
                    shallow_add = max(shallow - base["shallow"], 1e-9)
                    extra = at_add / shallow_add - 1
                    result = f"{_verdict(extra <= LONG_FUNCTION_MAX_EXTRA)} ({extra:+.0%})"
                else:
                    result = "not measured" if not have_at else "failed"
            case = f"{label} (untraced loop {base[workload]:.0f} ns)"
            rows.append(
                _row(
                    "hook",
                    case,
                    str(nframe),
                    f"+{tm_add:.0f} ns" if tm_add is not None else "failed",
                    f"+{at_add:.0f} ns" if at_add is not None else "—",
                    versus,
                    target,
                    result,
                )
            )
    return rows


def memory_rows(part: dict[str, Any], have_at: bool) -> list[str]:
    """Part 3 rows: tracer memory per live block, as reported and as the OS saw it."""
    rows = []
    for count in part["counts"]:
        rows += _memory_rows_at(count["figures"], count["blocks"], have_at)
    return rows


def _memory_rows_at(figures: dict[str, Any], blocks: int, have_at: bool) -> list[str]:
    """The two memory rows at one live block count."""
    tm, at = figures.get("tracemalloc:1"), figures.get("alloctrace:1")
    base = figures.get("none")
    label = f"{blocks:,} live blocks from 300 lines"

    def per_block(fig: dict[str, Any] | None, key: str) -> float | None:
        return None if fig is None else fig[key] / blocks

    def rss_extra(fig: dict[str, Any] | None) -> float | None:
        if fig is None or base is None:
            return None
        return (fig["rss_growth"] - base["rss_growth"]) / blocks

    def cell(value: float | None) -> str:
        return f"{value:.1f} B" if value is not None else "—"

    tm_rep, at_rep = per_block(tm, "tracer_growth"), per_block(at, "tracer_growth")
    tm_rss, at_rss = rss_extra(tm), rss_extra(at)
    missing = "not measured" if not have_at else "failed"
    return [
        _row(
            "memory",
            f"tracer memory per block, get_tracemalloc_memory() ({label})",
            "1",
            cell(tm_rep),
            cell(at_rep),
            f"{tm_rep / at_rep:.1f}x less" if tm_rep and at_rep else "—",
            f"≤{BYTES_PER_BLOCK_MAX:g} B",
            _verdict(at_rep <= BYTES_PER_BLOCK_MAX) if at_rep is not None else missing,
        ),
        _row(
            "memory",
            f"RSS growth per block beyond an untraced run ({label})",
            "1",
            cell(tm_rss),
            cell(at_rss),
            f"{tm_rss / at_rss:.1f}x less" if tm_rss and at_rss and at_rss > 0 else "—",
            "cross-check of the row above",
            "—",
        ),
    ]


def snapshot_rows(part: dict[str, Any], have_at: bool) -> list[str]:
    """Part 4 rows: operation times and dump size at the configured number of traces."""
    rows = []
    missing = "not measured" if not have_at else "failed"
    for nframe, answer in sorted(part["by_nframe"].items(), key=lambda kv: int(kv[0])):
        secs = answer["seconds"]
        tm_secs, at_secs = secs.get("tracemalloc", {}), secs.get("alloctrace")
        for op, tm in tm_secs.items():
            at = at_secs.get(op) if at_secs else None
            speedup = tm / at if at else None
            rows.append(
                _row(
                    "snapshot",
                    f"{op}, {part['traces']:,} traces",
                    nframe,
                    _seconds(tm),
                    _seconds(at) if at is not None else "—",
                    _speedup(speedup),
                    f"≥{SNAPSHOT_SPEEDUP_MIN:g}x faster",
                    _verdict(speedup >= SNAPSHOT_SPEEDUP_MIN) if speedup is not None else missing,
                )
            )
        sizes = answer["dump_bytes"]
        tm_size, at_size = sizes.get("tracemalloc"), sizes.get("alloctrace")
        ratio = at_size / tm_size if tm_size and at_size is not None else None
        rows.append(
            _row(
                "snapshot",
                f"dump file size, {part['traces']:,} traces (tracemalloc: pickle)",
                nframe,
                _size(tm_size) if tm_size is not None else "—",
                _size(at_size) if at_size is not None else "—",
                f"{ratio:.2f}x the size" if ratio is not None else "—",
                f"≤{DUMP_SIZE_MAX_RATIO:g}x the pickle",
                _verdict(ratio <= DUMP_SIZE_MAX_RATIO) if ratio is not None else missing,
            )
        )
    return rows


def objects_rows(part: dict[str, Any], have_at: bool) -> list[str]:
    """Part 5 rows: take_snapshot() and take_snapshot(objects=True) on the same heap."""
    missing = "not measured" if not have_at else "failed"
    by_mode = part["by_mode"]
    plain, objects = by_mode.get("plain"), by_mode.get("objects")
    case = f"{part['objects']:,} live objects"
    rows = []
    if plain is not None:
        rows.append(
            _row(
                "objects",
                f"take_snapshot(), {case} ({plain['traces']:,} traces)",
                "1",
                "—",
                _seconds(plain["seconds"]),
                "—",
                "(reference)",
                "—",
            )
        )
    if objects is not None:
        ratio = objects["seconds"] / plain["seconds"] if plain else None
        rows.append(
            _row(
                "objects",
                f"take_snapshot(objects=True), {case} ({objects['kinds']} kinds)",
                "1",
                "—",
                _seconds(objects["seconds"]),
                f"{ratio:.1f}x take_snapshot()" if ratio is not None else "—",
                f"≤{OBJECTS_SNAPSHOT_MAX_SECONDS:g} s",
                _verdict(objects["seconds"] <= OBJECTS_SNAPSHOT_MAX_SECONDS),
            )
        )
        growth = objects["peak_rss_growth"]
        base = plain["peak_rss_growth"] if plain else None
        rows.append(
            _row(
                "objects",
                f"peak RSS growth during take_snapshot(objects=True), {case}",
                "1",
                "—",
                _size(growth),
                f"take_snapshot(): {_size(base)}" if base is not None else "—",
                "(reported)",
                "—",
            )
        )
    if not rows:
        rows.append(_row("objects", case, "1", "—", "—", "—", "—", missing))
    return rows


RENDERERS = {
    "overhead": overhead_rows,
    "hook": hook_rows,
    "memory": memory_rows,
    "snapshot": snapshot_rows,
    "objects": objects_rows,
}


def render(facts: dict[str, Any], parts: dict[str, dict[str, Any]]) -> str:
    """Return the markdown for one interpreter: a short header and the table."""
    interp, machine = facts["interpreter"], facts["machine"]
    have_at = not interp["alloctrace_problem"]
    lines = [
        f"### alloctrace benchmarks: {interp['python']}",
        "",
        f"- Command: `{facts['command']}` ({facts['preset']} preset)",
        f"- Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}, "
        f"{machine['system']}; 1-minute load average {facts['load_before']} at start, "
        f"{facts['load_after']} at end",
        f"- Interpreter: {interp['python']} ({interp['executable']}); "
        f"pyperformance {interp['pyperformance']}",
        f"- alloctrace: {interp['alloctrace']} from commit {facts['commit']}"
        + ("" if have_at else f" — **alloctrace column absent: {interp['alloctrace_problem']}**"),
        f"- Date: {facts['date']}; wall time {facts['wall']}",
        "- Method: each figure is a median over child processes that run untraced, under "
        "tracemalloc and under alloctrace in turn (interleaved, the order rotating every "
        "round); a slowdown is traced time / untraced time of the same work. The machine is "
        "shared, so single figures carry noise of roughly ±10%; the tracer's state is "
        "checked with is_tracing() inside every child before and after timing.",
    ]
    over = parts.get("overhead", {}).get("settings")
    if over:
        lines.append(
            f"- Overhead runs: {over['rounds']} interleaved round(s) of one child per benchmark "
            f"and mode, {over['values']} value(s) per child (one for workloads whose single "
            f"loop outlasts 5x the {over['min_time']:g} s target)"
            + (
                f"; tracemalloc at nframe 25 (10-40x slowdowns) only in the first "
                f"{over['reference_rounds']} round(s)"
                if over["reference_rounds"] < over["rounds"] and 25 in parts["overhead"]["nframes"]
                else ""
            )
            + (
                f"; a value still running after {over['budget']:g} s is cut short, which "
                "makes its figure a lower bound, marked ≥"
                if over.get("budget")
                else ""
            )
        )
    lines += ["", HEADER]
    for name, part in parts.items():
        lines.extend(RENDERERS[name](part, have_at))
    if "overhead" in parts:
        lines.extend(round_spread(parts["overhead"]))
        lines.extend(side_by_side(parts["overhead"]))
    problems = [
        f"{name}: {what}: {message.splitlines()[-1] if message else ''}"
        for name, part in parts.items()
        for what, message in part.get("errors", {}).items()
    ]
    if problems:
        lines += ["", "Failures (the affected cells read 'failed' or are missing):", ""]
        lines += [f"- {p}" for p in problems]
    return "\n".join(lines) + "\n"
