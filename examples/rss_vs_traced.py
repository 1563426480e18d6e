"""Why the traced total and the process's RSS differ: three steps, each moving one of them.

    python examples/rss_vs_traced.py

prints, after each step, what alloctrace traces and what the kernel reports resident
(alloctrace.get_process_memory()):

1. start: the interpreter's code and libraries are resident (file-backed) but were never
   allocated through a traced allocator; the tracer's own table (the "tracer" column,
   get_tracemalloc_memory()) is resident and untraced too, one entry per live block;
2. many small objects, then 9 in 10 freed: the traced total falls back, the RSS does not:
   pymalloc keeps an arena (256 KiB, 1 MiB from 3.10) as long as one object in it lives, and
   freed memory stays in the process for reuse;
3. an anonymous mmap, written: resident and anonymous, but untraced (no allocator saw it).
"""

import mmap

import alloctrace

MIB = 1 << 20


def row(step, traced):
    pm = alloctrace.get_process_memory()
    tracer = alloctrace.get_tracemalloc_memory()
    print(
        f"{step:<26} traced {traced / MIB:5.1f} MiB  RSS {pm.rss / MIB:5.1f} MiB"
        f"  (anonymous {pm.anon / MIB:5.1f}, file-backed {pm.file / MIB:4.1f},"
        f" tracer {tracer / MIB:4.1f})"
    )


def main():
    alloctrace.start()
    row("1. start", alloctrace.get_traced_memory()[0])

    objects = [str(i) * 4 for i in range(1_000_000)]  # ~60 MiB of small strings
    row("2a. 1M small objects", alloctrace.get_traced_memory()[0])
    kept = objects[::10]
    del objects
    row("2b. 9 in 10 freed", alloctrace.get_traced_memory()[0])

    untraced = mmap.mmap(-1, 64 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    untraced.write(b"\1" * len(untraced))  # every page touched: resident
    row("3. 64 MiB anonymous mmap", alloctrace.get_traced_memory()[0])

    snapshot = alloctrace.take_snapshot()
    traced = sum(stat.size for stat in snapshot.statistics("filename"))
    pm = snapshot.process_memory
    print(f"snapshot: traced {traced / MIB:.1f} MiB of RSS {pm.rss / MIB:.1f} MiB")
    untraced.close()
    del kept


if __name__ == "__main__":
    main()
