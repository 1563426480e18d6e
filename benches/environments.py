"""Where the benchmarks run: per-interpreter virtual environments and the machine's description.

Each interpreter gets its own venv under a cache directory, holding pyperformance (the benchmark
scripts), memray (a comparison column) and an alloctrace wheel built from this checkout with
``maturin build --release``, so a benchmark run never measures a debug build or whatever
happens to be installed elsewhere.
``--python current`` skips all of that and measures the running interpreter as it is.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import childproc

REPO = childproc.BENCH_DIR.parent
SUPPORTED = ("3.9", "3.10", "3.11", "3.12", "3.13")
DEFAULT_VERSION = "3.11"


def find_interpreter(version: str) -> str:
    """Return the path of a CPython *version* ("3.11") interpreter, or raise SystemExit."""
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(os.path.join(pyenv_root, "versions", f"{version}.*", "bin")))
    for directory in reversed(candidates):
        path = os.path.join(directory, "python3")
        if os.access(path, os.X_OK):
            return path
    found = shutil.which(f"python{version}")
    if found:
        return found
    raise SystemExit(f"no Python {version} interpreter found (looked in pyenv and on PATH)")


@functools.cache
def interpreter_path_version(path: str) -> str:
    """The "3.X" version of the interpreter at *path* (an ``--python`` given as a path), or
    raise SystemExit saying why it cannot be used. Probed once per path (the venv's name asks
    again after validation); a refusal is not remembered."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise SystemExit(f"--python {path}: not an executable file")
    probe = subprocess.run(
        [
            path,
            "-c",
            "import platform, sys; print(platform.python_implementation(), *sys.version_info[:2])",
        ],
        capture_output=True,
        text=True,
    )
    fields = probe.stdout.split() if probe.returncode == 0 else []
    version = ".".join(fields[1:3]) if len(fields) == 3 else ""
    if fields[:1] != ["CPython"] or version not in SUPPORTED:
        found = " ".join(fields) or "does not run Python code"
        raise SystemExit(
            f"--python {path}: not a CPython {SUPPORTED[0]}-{SUPPORTED[-1]} interpreter ({found})"
        )
    return version


def venv_name(spec: str) -> str:
    """The cache's venv directory for a version ("venv-3.11") or an interpreter's path
    ("venv-3.11-usr-bin-python3.11"), so that two builds of one version keep apart."""
    if os.sep not in spec:
        return f"venv-{spec}"
    tail = "".join(c if c.isalnum() or c == "." else "-" for c in os.path.realpath(spec))
    return f"venv-{interpreter_path_version(spec)}-{tail.strip('-')}"


def _run(cmd: list[str], **kwargs: object) -> None:
    childproc.progress("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]


def prepare_venv(version: str, cache: Path, alloctrace: str) -> str:
    """Create or refresh the venv for *version* ("3.11", or an interpreter's path); return its
    python.

    *alloctrace* is "build" (build a release wheel from this checkout and install it), a path to
    a wheel to install, or "skip" (leave alloctrace out).
    """
    base = version if os.sep in version else find_interpreter(version)
    venv = cache / venv_name(version)
    python = venv / "bin" / "python"
    if not python.exists():
        _run([base, "-m", "venv", str(venv)])
        _run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    probe = subprocess.run([str(python), "-c", "import pyperformance"], capture_output=True)
    if probe.returncode != 0:
        _run([str(python), "-m", "pip", "install", "-q", "pyperformance"])
    probe = subprocess.run([str(python), "-c", "import memray"], capture_output=True)
    if probe.returncode != 0:
        # memray is a comparison column, not a requirement: without it the column is absent.
        cmd = [str(python), "-m", "pip", "install", "-q", "memray"]
        childproc.progress("$ " + " ".join(cmd))
        if subprocess.run(cmd).returncode != 0:
            childproc.progress("memray did not install; its columns will be absent")
    if alloctrace == "skip":
        subprocess.run(
            [str(python), "-m", "pip", "uninstall", "-q", "-y", "alloctrace"], capture_output=True
        )
        return str(python)
    wheel = alloctrace if alloctrace != "build" else build_wheel(str(python), cache / "wheels")
    _run([str(python), "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", wheel])
    return str(python)


def build_wheel(python: str, out_dir: Path) -> str:
    """Build a release wheel of this checkout for *python* with maturin; return its path."""
    maturin = shutil.which("maturin")
    if maturin is None:
        subprocess.run([python, "-m", "pip", "install", "-q", "maturin"], check=True)
        maturin = str(Path(python).parent / "maturin")
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = subprocess.run(
        [python, "-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for old in out_dir.glob(f"alloctrace-*-{tag}-*.whl"):
        old.unlink()
    _run([maturin, "build", "--release", "-i", python, "--out", str(out_dir)], cwd=REPO)
    wheels = sorted(out_dir.glob(f"alloctrace-*-{tag}-*.whl"))
    if not wheels:
        raise SystemExit(f"maturin built no {tag} wheel in {out_dir}")
    return str(wheels[-1])


def interpreter_facts(python: str) -> dict[str, str]:
    """Version and package facts about the interpreter the children will run."""
    code = (
        "import json, platform, sys\n"
        "facts = {'python': f'{platform.python_implementation()} {platform.python_version()}',"
        " 'executable': sys.executable}\n"
        "for name in ('pyperformance', 'alloctrace'):\n"
        "    try:\n"
        "        from importlib.metadata import version\n"
        "        facts[name] = version(name)\n"
        "    except Exception:\n"
        "        facts[name] = 'not installed'\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import tracers\n"
        "facts['alloctrace_problem'] = tracers.alloctrace_status() or ''\n"
        "print(json.dumps(facts))\n"
    )
    out = subprocess.run(
        [python, "-c", code, str(childproc.BENCH_DIR)],
        capture_output=True,
        text=True,
        check=True,
        env=childproc.child_env(),
    ).stdout
    return json.loads(out)


def machine_facts() -> dict[str, str]:
    """CPU, cores, memory and kernel of this machine, for the report's header."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            mem_kib = int(f.readline().split()[1])
        memory = f"{mem_kib / 2**20:.1f} GiB RAM"
    except OSError:
        memory = "unknown RAM"
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": memory,
        "system": f"{platform.system()} {platform.release()}",
    }


def load_average() -> str:
    """One-minute load average, a rough noise indicator printed with the results."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


def git_commit() -> str:
    """Short commit of the checkout being measured, with a marker if it has local changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (head or "unknown") + (" (modified)" if dirty else "")


def current_python() -> str:
    """The interpreter running the harness, for ``--python current``."""
    return sys.executable
