"""Child Python processes for the start-up, CLI and example tests.

A child gets this process's environment minus every setting that would change what it traces
or prints (``ALLOCTRACE*``, ``PYTHONTRACEMALLOC``, ``COLUMNS``), so that each test states
exactly the settings it depends on.
"""

import os
import subprocess
import sys

TIMEOUT = 120


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCTRACE")}
    env.pop("PYTHONTRACEMALLOC", None)
    env.pop("COLUMNS", None)
    env.update(extra)
    return env


def run_python(args, cwd=None, **env):
    """Runs ``python ARGS`` with :func:`clean_env` plus *env*; output captured as text."""
    return subprocess.run(
        [sys.executable, *args],
        env=clean_env(**env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
