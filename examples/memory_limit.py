"""A service whose cache grows without bound, the way jobs drift towards the OOM killer: the
example behind the memory-limit section of the README. Run it with

    alloctrace run --memory-limit 32MiB examples/memory_limit.py

When traced memory first reaches 32 MiB, a snapshot with its peak is written (a line on stderr
names the file) and the program runs on; ``alloctrace stats --peak FILE`` then shows what held
the memory. In production, ``ALLOCTRACE_MEMORY_LIMIT=cgroup:0.8`` sets the limit at 80% of the
container's.
"""

CACHE = {}


def render(report_id):
    return f"report {report_id}\n".encode() * 3000  # about 40 KiB


def handle(report_id):
    if report_id not in CACHE:
        CACHE[report_id] = render(report_id)  # never evicted
    return len(CACHE[report_id])


def main():
    served = sum(handle(i % 1200) for i in range(5000))
    print(f"served {served} bytes, {len(CACHE)} reports cached")


if __name__ == "__main__":
    main()
