"""Adapting a standard module to alloctrace when the program imports it, not before.

alloctrace changes two functions of the standard library so that they know it as they know
``tracemalloc``: the warnings formatter (where a warning's object was allocated) and
``subprocess._args_from_interpreter_flags`` (``-X alloctrace`` for multiprocessing's children).
Importing those modules to change them would load modules the program may never import, or
import later: a module loaded before tracing starts is charged to no line when the program
imports it, unlike under ``tracemalloc``, and each costs start-up time. So :func:`when_imported`
changes a module already imported at once, and otherwise waits at the head of
``sys.meta_path`` for the program's own import of it. The finder finds nothing itself: it
hands on the other finders' answer with a loader that runs the module as the real loader
would and then the change, after putting the real loader back in the module's spec, so that
nothing after the import sees the finder or its loader. When nothing is left to wait for, the
finder leaves ``sys.meta_path``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

# Not `typing`: importing alloctrace loads no module that importing tracemalloc would not.
Change = Callable[[object], None]


def when_imported(name: str, change: Change) -> None:
    """Call *change* with the module *name* now if it is imported, else right after the
    program imports it (once)."""
    module = sys.modules.get(name)
    if module is not None:
        change(module)
        return
    _wait(name, [change])


def _wait(name: str, changes: list[Change]) -> None:
    _Watch.waiting.setdefault(name, []).extend(changes)
    if _Watch not in sys.meta_path:
        sys.meta_path.insert(0, _Watch)


class _Loader:
    """The real loader of a watched module, then its changes."""

    def __init__(self, name: str, loader, changes: list[Change]) -> None:
        self._name = name
        self._loader = loader
        self._changes = changes

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__spec__.loader = module.__loader__ = self._loader
        try:
            self._loader.exec_module(module)
        except BaseException:
            # The import failed (the half-made module is still in sys.modules until the
            # error leaves): wait for the next attempt.
            _wait(self._name, self._changes)
            raise
        for change in self._changes:
            try:
                change(module)
            except Exception:
                # The program's import must not fail for an adaptation it did not ask for.
                pass

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


class _Watch:
    """The finder on ``sys.meta_path`` (a class: finders may be classes, as the standard
    ones are)."""

    #: Module name -> the changes waiting for its import.
    waiting: dict[str, list[Change]] = {}

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        changes = cls.waiting.pop(name, None)
        if changes is None:
            return None
        if not cls.waiting and cls in sys.meta_path:
            sys.meta_path.remove(cls)
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is cls or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            # Not found (the import fails) or loaded some other way: wait for another import.
            _wait(name, changes)
            return spec
        spec.loader = _Loader(name, spec.loader, changes)
        return spec
