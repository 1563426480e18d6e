#!/usr/bin/env bash
# Fuzzes alloctrace's parsers of untrusted input for a fixed number of executions per target:
#   snapshot_decode    Snapshot.load() on arbitrary bytes
#   snapshot_sections  the same, with header and checksum made valid (reaches the sections)
#   filter_pattern     Filter(filename_pattern=...) compilation and matching
#
#   fuzz/run.sh                 # every target, RUNS executions each (default 200000)
#   RUNS=1000000 fuzz/run.sh filter_pattern
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`). cargo-fuzz passes nightly-only flags to rustc
# (-Zsanitizer=address...); RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them. The
# library links libpython (pyo3), so a CPython with its shared library is needed, although the
# parsers never call it. Exit status 0 only if no target found a crash, hang or leak.
#
# Limits: an input of at most 64 KiB must not make the parser allocate more than 64 MiB at once
# (-malloc_limit_mb) or hold more than 1 GiB in total (-rss_limit_mb), nor take over 10 s.
set -euo pipefail

fuzz=$(cd "$(dirname "$0")" && pwd)
cd "$fuzz"
runs=${RUNS:-200000}
py=${PYO3_PYTHON:-$(command -v python3)}
libdir=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')
export RUSTC_BOOTSTRAP=1
export PYO3_PYTHON=$py
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$fuzz/target}

targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    targets=(snapshot_decode snapshot_sections filter_pattern)
fi

cargo fuzz build -O

status=0
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target" "$CARGO_TARGET_DIR"
    log=$CARGO_TARGET_DIR/fuzz-$target.log
    printf '\n==> %s: %s runs (full log: %s)\n' "$target" "$runs" "$log"
    rc=0
    cargo fuzz run -O "$target" "corpus/$target" -- \
        -runs="$runs" -max_len=65536 -timeout=10 \
        -malloc_limit_mb=64 -rss_limit_mb=1024 -print_final_stats=1 >"$log" 2>&1 || rc=$?
    grep -E '^stat::(number_of_executed_units|peak_rss_mb|new_units_added)|^Done |SUMMARY|panicked|crash-|timeout-|oom-|leak-' "$log" || true
    if [ "$rc" -ne 0 ]; then
        echo "FAILED: $target (exit $rc; artifacts in fuzz/artifacts/$target)"
        status=1
    fi
done
exit $status
