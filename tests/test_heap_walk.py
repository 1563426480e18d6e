"""The heap walk behind object kinds: it finds the collector's objects and what they refer to,
names types as ``module.QualName``, attributes container buffers to their owners, and
survives objects with unusual layouts and other threads allocating while it runs."""

import array
import asyncio
import collections
import ctypes
import decimal
import gc
import io
import itertools
import threading
import weakref

import pytest

import alloctrace
from alloctrace import _native

try:
    import sqlite3
except ImportError:  # pragma: no cover - built without sqlite
    sqlite3 = None


class Plain:
    def __init__(self, i):
        self.i = i
        self.name = f"plain-{i}"


class Slotted:
    __slots__ = ("a", "b", "__weakref__")

    def __init__(self, a):
        self.a = a
        self.b = [a]


class Hostile:
    """Comparing or hashing it raises: the walk must never compare or hash objects."""

    def __eq__(self, other):
        raise RuntimeError("__eq__ called")

    def __hash__(self):
        raise RuntimeError("__hash__ called")

    def __repr__(self):
        raise RuntimeError("__repr__ called")


class Outer:
    class Inner:
        pass


def qualified(cls):
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def census(roots=()):
    nodes, edges, types, buffers = _native._heap_census(list(roots))
    assert nodes == sum(count for count, _ in types.values())
    return nodes, edges, types, buffers


def test_counts_instances_by_qualified_name():
    keep = [Plain(i) for i in range(500)] + [Outer.Inner() for _ in range(7)]
    _, _, types, _ = census()
    assert types[f"{__name__}.Plain"][0] >= 500
    assert types[f"{__name__}.Outer.Inner"][0] >= 7
    assert types["list"][0] >= 1
    assert types["dict"][0] >= 1
    del keep


def test_builtin_and_extension_types_are_named_as_repr_names_them():
    keep = [collections.deque([1]), collections.OrderedDict(a=1), decimal.Decimal("1.5")]
    _, _, types, _ = census()
    assert types["collections.deque"][0] >= 1
    assert types["collections.OrderedDict"][0] >= 1
    assert types["decimal.Decimal"][0] >= 1
    assert "type" in types and "function" in types and "module" in types
    del keep


def test_untracked_objects_are_reached_through_their_referents():
    marker = "only-here-" + "x" * 1000
    big = 10**200
    blob = b"y" * 5000
    holder = [marker, big, blob]
    _, _, types, _ = census()
    # str, int and bytes are never tracked by the collector: found through the list.
    assert types["str"][0] > 0 and types["int"][0] > 0 and types["bytes"][0] > 0
    nodes_without, _, _, _ = census()
    del holder
    assert nodes_without > 0


def test_extra_roots_reach_untracked_objects():
    # A tuple of atoms is untracked once the collector has looked at it; only the root finds
    # its contents if nothing else refers to them.
    value = ("root-only-" + "z" * 100,)
    gc.collect()
    base_nodes, _, _, _ = census()
    nodes, _, _, _ = census([value])
    assert nodes >= base_nodes


def test_sizes_include_buffers_of_containers():
    alloctrace.start()
    try:
        big_list = [None] * 100_000
        big_ba = bytearray(200_000)
        big_set = set(range(50_000))
        big_dict = {i: i for i in range(50_000)}
        _, _, types, buffers = census()
    finally:
        alloctrace.stop()
    assert buffers["list (items)"][1] >= 100_000 * 8
    assert buffers["bytearray (buffer)"][1] >= 200_000
    assert buffers["set (table)"][1] >= 50_000 * 16
    assert buffers["dict (keys)"][1] >= 50_000 * 8
    assert types["list"][1] >= 100_000 * 8
    del big_list, big_ba, big_set, big_dict


def _gen():
    yield 1


async def _coro():
    await asyncio.sleep(0)


def _closure():
    x = [1, 2, 3]

    def inner():
        return x

    return inner


def test_survives_unusual_objects():
    frame_holder = []

    def capture_frame():
        import sys

        frame_holder.append(sys._getframe())

    capture_frame()
    gen = _gen()
    next(gen)
    coro = _coro()
    p = Plain(1)
    keep = [
        ctypes.c_int(5),
        (ctypes.c_char * 64)(),
        ctypes.create_string_buffer(100),
        array.array("d", range(100)),
        decimal.Decimal("3.14"),
        decimal.getcontext(),
        io.BytesIO(b"abc"),
        io.StringIO("abc"),
        io.TextIOWrapper(io.BytesIO(b"x")),
        itertools.count(),
        itertools.chain([1], [2]),
        itertools.groupby("aabb"),
        itertools.tee([1, 2, 3]),
        memoryview(b"abcdef")[1:3],
        memoryview(bytearray(10)),
        weakref.ref(p),
        weakref.proxy(p),
        weakref.WeakValueDictionary({1: p}),
        weakref.WeakSet([p]),
        weakref.finalize(p, lambda: None),
        frame_holder,
        gen,
        coro,
        _closure(),
        _closure().__closure__[0],
        Slotted(1),
        weakref.ref(Slotted(2)),
        Hostile(),
        {Plain(2): 1},
        type("Dynamic", (object,), {"x": 1})(),
        type("Meta", (type,), {})("ViaMeta", (), {}),
        p,
        p.__dict__,
        Plain(3),
        iter([1, 2]),
        reversed([1, 2]),
        range(10),
        slice(1, 2),
        property(lambda s: 1),
        classmethod(lambda c: 1),
        staticmethod(lambda: 1),
        super(Plain, p),
        collections.defaultdict(list, a=[1]),
        collections.Counter("abc"),
        collections.ChainMap({}, {}),
        frozenset([1, 2]),
        set(range(10)),
        object(),
        NotImplemented,
        Ellipsis,
        asyncio.new_event_loop,
    ]
    if sqlite3 is not None:
        conn = sqlite3.connect(":memory:")
        cur = conn.execute("select 1")
        keep += [conn, cur]
    # Instance attributes stored inline (3.11+ managed dict, never materialised).
    inline = [Plain(i) for i in range(100)]
    for obj in inline[:10]:
        _ = obj.__dict__  # materialise some dicts, leave the rest inline
    nodes, edges, types, _ = census([keep, inline])
    assert nodes > 1000 and edges > nodes
    assert types[f"{__name__}.Slotted"][0] >= 1
    assert types[f"{__name__}.Hostile"][0] >= 1
    assert types["generator"][0] >= 1
    assert types["coroutine"][0] >= 1
    assert types["cell"][0] >= 1
    assert types["frame"][0] >= 1
    assert types[qualified(weakref.ref)][0] >= 1
    assert types["memoryview"][0] >= 2
    assert types["array.array"][0] >= 1
    assert types[f"{__name__}.Meta"][0] >= 1
    # Inline attribute values are reached through the instance's own traversal.
    assert types["str"][0] >= 100
    coro.close()
    if sqlite3 is not None:
        cur.close()
        conn.close()


def test_walk_while_other_threads_allocate():
    stop = threading.Event()

    def churn():
        junk = []
        while not stop.is_set():
            junk.append({"k": [Plain(1), bytearray(100)]})
            if len(junk) > 1000:
                junk.clear()

    threads = [threading.Thread(target=churn) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(10):
            nodes, _, types, _ = census()
            assert nodes > 0 and types["dict"][0] > 0
    finally:
        stop.set()
        for t in threads:
            t.join()


def test_frozen_objects_are_found():
    obj = Outer.Inner()
    holder = [obj]
    gc.freeze()
    try:
        _, _, types, _ = census()
        assert types[f"{__name__}.Outer.Inner"][0] >= 1
    finally:
        gc.unfreeze()
    del holder


def test_refused_while_collecting():
    results = []

    class Finalised:
        def __init__(self):
            self.cycle = self

        def __del__(self):
            try:
                _native._heap_census()
            except RuntimeError as exc:
                results.append(str(exc))
            else:
                results.append(None)

    Finalised()
    gc.collect()
    assert results and results[0] is not None
    assert "garbage collector is collecting" in results[0]


@pytest.mark.parametrize("roots", [[None], [1, "a", b"b"], [[]]])
def test_roots_of_any_kind(roots):
    nodes, _, _, _ = census(roots)
    assert nodes > 0
