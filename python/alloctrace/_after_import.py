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
    program imports it (once). An exception from *change* is swallowed: a program's import
    must not fail for an adaptation it did not ask for."""
    module = sys.modules.get(name)
    if module is not None:
        _apply([change], module)
        return
    _Watch.waiting.setdefault(name, []).append(change)
    if _Watch not in sys.meta_path:
        sys.meta_path.insert(0, _Watch)


def _apply(changes: list[Change], module) -> None:
    for change in changes:
        try:
            change(module)
        except Exception:
            pass


class _Loader:
    """The real loader of a watched module, then the changes waiting for it. They are taken
    only once the module has run: a spec asked for without an import
    (``importlib.util.find_spec``) or an import that fails leaves them waiting."""

    def __init__(self, name: str, loader) -> None:
        self._name = name
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__spec__.loader = module.__loader__ = self._loader
        self._loader.exec_module(module)
        changes = _Watch.waiting.pop(self._name, [])
        if not _Watch.waiting and _Watch in sys.meta_path:
            sys.meta_path.remove(_Watch)
        _apply(changes, module)

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


class _Watch:
    """The finder on ``sys.meta_path`` (a class: finders may be classes, as the standard
    ones are)."""

    #: Module name -> the changes waiting for its import.
    waiting: dict[str, list[Change]] = {}

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name not in cls.waiting:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is cls or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(name, spec.loader)
        return spec
