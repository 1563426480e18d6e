"""``alloctrace._after_import.when_imported``: a standard module is adapted when the program
imports it, and the import looks as it would without alloctrace."""

import importlib
import importlib.util
import sys

import pytest

from alloctrace import _after_import
from alloctrace._after_import import when_imported


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """Names of modules that exist on sys.path but are not imported; forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made = []

    def make(name, source="VALUE = 1\n"):
        (tmp_path / f"{name}.py").write_text(source)
        made.append(name)
        importlib.invalidate_caches()
        return name

    yield make
    for name in made:
        sys.modules.pop(name, None)
        _after_import._Watch.waiting.pop(name, None)
    if not _after_import._Watch.waiting and _after_import._Watch in sys.meta_path:
        sys.meta_path.remove(_after_import._Watch)


def watching():
    return _after_import._Watch in sys.meta_path


def test_already_imported_is_changed_at_once(fresh):
    name = fresh("at_once")
    module = importlib.import_module(name)
    seen = []
    when_imported(name, seen.append)
    assert seen == [module] and not watching()


def test_changed_after_the_program_imports_it(fresh):
    name = fresh("later", "VALUE = 1\nSEEN_BY_CHANGE = None\n")
    order = []
    when_imported(name, lambda m: order.append(("first", m.VALUE)))
    when_imported(name, lambda m: order.append(("second", m.VALUE)))
    assert order == [] and watching() and name not in sys.modules
    module = importlib.import_module(name)
    assert order == [("first", 1), ("second", 1)]
    # The module's spec and loader are the real ones; the finder has left.
    assert type(module.__loader__).__name__ == "SourceFileLoader"
    assert module.__spec__.loader is module.__loader__
    assert not watching()
    importlib.reload(module)
    assert len(order) == 2


def test_a_failed_import_waits_for_the_next(fresh, tmp_path):
    name = fresh("broken", "raise ImportError('not yet')\n")
    seen = []
    when_imported(name, lambda m: seen.append(m.VALUE))
    with pytest.raises(ImportError, match="not yet"):
        importlib.import_module(name)
    assert seen == [] and watching()
    sys.modules.pop(name, None)
    (tmp_path / f"{name}.py").write_text("VALUE = 2\n")
    importlib.invalidate_caches()
    importlib.import_module(name)
    assert seen == [2] and not watching()


def test_a_spec_asked_for_without_an_import_leaves_the_change_waiting(fresh):
    name = fresh("only_looked_up")
    seen = []
    when_imported(name, lambda m: seen.append(m.VALUE))
    assert importlib.util.find_spec(name) is not None
    assert seen == [] and watching() and name not in sys.modules
    importlib.import_module(name)
    assert seen == [1] and not watching()


def test_a_missing_module_stays_awaited_and_a_failing_change_does_not_fail_the_import(fresh):
    missing = "alloctrace_no_such_module"
    when_imported(missing, lambda m: None)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(missing)
    assert missing in _after_import._Watch.waiting
    _after_import._Watch.waiting.pop(missing)

    name = fresh("change_fails")

    def fails(module):
        raise RuntimeError("adaptation bug")

    when_imported(name, fails)
    assert importlib.import_module(name).VALUE == 1
