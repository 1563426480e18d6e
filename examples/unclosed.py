"""A file left open, and the ResourceWarning that says where it was opened.

Run it with alloctrace tracing from start-up and warnings shown::

    python -X alloctrace=5 -W always examples/unclosed.py

and the warning ends with "Object allocated at (most recent call last):" and the lines that
opened the file, as under ``python -X tracemalloc=5``. Without tracing it ends with
"Enable tracemalloc to get the object allocation traceback".
"""

import os


def open_settings():
    return open(os.devnull)


def load():
    settings = open_settings()
    del settings  # never closed: CPython warns when the file object goes


load()
