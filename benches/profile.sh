#!/usr/bin/env bash
# Profile one benchmark child, to explain a figure (a MISS) in the benchmark table.
#
# usage: benches/profile.sh [--tool perf|callgrind] [--python PY] MODE TARGET [LOOPS]
#   MODE    none | tracemalloc:N | alloctrace:N          (e.g. alloctrace:1)
#   TARGET  hook (the allocation micro-benchmark) or a pyperformance benchmark directory
#           name without its bm_ prefix (float, nbody, json_dumps, ...)
#   LOOPS   loops of the pyperformance workload (default 1); ignored for hook
#
# perf (default) samples the CPU clock with call graphs; this VM exposes no hardware counters,
# so it reports where time goes, not instruction counts.  callgrind counts instructions, which
# repeat exactly from run to run even on a busy machine, at ~50x the run time: use it with the
# hook target or a single loop.  Output (raw data and the text report) goes to a fresh directory
# under /tmp, whose path is printed; the top of the report is printed too.  PY defaults to the
# python on PATH, which must have pyperformance and the alloctrace build to be profiled
# installed (e.g. the venv benches/run.py made under ~/.cache/alloctrace-bench).
set -euo pipefail

tool=perf
python=python3
while [[ $# -gt 0 ]]; do
    case "$1" in
        --tool) tool="$2"; shift 2 ;;
        --python) python="$2"; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) break ;;
    esac
done
if [[ $# -lt 2 ]]; then
    sed -n '2,17p' "$0" >&2
    exit 2
fi
mode="$1"
target="$2"
loops="${3:-1}"
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mktemp -d /tmp/alloctrace-profile-XXXXXX)"

if [[ "$target" == hook ]]; then
    child=("$here/child.py" hook --mode "$mode" --iterations 200000 --seconds 1 --repeats 1)
else
    child=("$here/child.py" overhead --bench "bm_$target" --mode "$mode" --loops "$loops"
           --values 1 --warmups 0)
fi
child+=(--result "$out/result.json")

case "$tool" in
    perf)
        command -v perf >/dev/null || { echo "perf not found: apt-get install linux-perf" >&2; exit 1; }
        perf record -e cpu-clock -F 2000 -g -o "$out/perf.data" -- "$python" "${child[@]}"
        perf report -i "$out/perf.data" --no-children --sort dso,symbol --stdio -g none --percent-limit 0.5 \
            > "$out/report.txt" 2>/dev/null
        ;;
    callgrind)
        command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install valgrind" >&2; exit 1; }
        # --smc-check=all: alloctrace patches libpython's code at start() on 3.9-3.12, which
        # valgrind would not otherwise see (benches/instructions.py says more).
        valgrind --tool=callgrind --smc-check=all --callgrind-out-file="$out/callgrind.out" \
            "$python" "${child[@]}" 2> "$out/valgrind.log"
        callgrind_annotate --inclusive=no "$out/callgrind.out" > "$out/report.txt"
        ;;
    *)
        echo "unknown --tool $tool (expected perf or callgrind)" >&2
        exit 2
        ;;
esac

echo "timing: $(cat "$out/result.json")"
echo "full report: $out/report.txt"
grep -v '^#' "$out/report.txt" | grep -v '^$' | head -40
