"""Why is it alive: reference chains from the roots to objects, retained sizes, referrer patterns.

The native side walks the object graph (every object the cyclic collector tracks and what it
refers to) without running Python code, and answers with chains of objects. This module picks
the roots, names each edge of the chains the way a programmer reads it, and keeps only names
and numbers (never the objects themselves, so a report never keeps a leak alive).

Roots: every module in :data:`sys.modules` (named by its key there; ``builtins`` and ``sys``
are modules, so whatever the interpreter keeps reachable from them, such as import caches and
``functools`` caches of module-level functions, counts as reachable), and the frames of every
thread (:func:`sys._current_frames`, each stack followed to its oldest frame). On 3.11+ the
locals of a running function live in the interpreter's frame, which the frame object does not
expose to the collector, so each frame's locals are taken as a root of their own; the walk also
links each frame suspended in a call to Python code to the temporaries on its evaluation stack
(``stack temporary`` edges), which nothing else may hold. The frames of
alloctrace itself are not roots, and those of the thread that asks (which hold the object to
ask about it) count last: a chain through them is reported after the chains from every other
root, and explains an object alone only when nothing else reaches it. An object that no root
reaches is reported as unreachable: garbage kept in a reference cycle, or held only by
something that is not a root (a C extension's static variable).
"""

import _thread
import gc
import sys
import types

from alloctrace import _native
from alloctrace._snapshot import Traceback, _format_size

_PACKAGE_DIR = __file__.rpartition("/")[0] + "/"
_REPR_LIMIT = 40
_MODERN_FRAMES = sys.version_info >= (3, 11)


def _type_name(obj):
    """The qualified type name of *obj*, module-prefixed unless a builtin."""
    try:
        t = type(obj)
        module = t.__dict__.get("__module__", "builtins")
        qualname = t.__qualname__
        if not isinstance(module, str) or module == "builtins":
            return str(qualname)
        return f"{module}.{qualname}"
    except Exception:
        return "?"


# Per thread ident, how deep it is in dumps the program did not call for (see
# without_user_code); a dict of builtin ints, so no lock and no threading import.
_no_user_code = {}

# Types whose repr is the interpreter's own C code: it runs nothing of the program's.
_PLAIN_TYPES = (str, bytes, int, float, complex, bool, type(None))


class without_user_code:
    """Inside, in this thread, names leave out what only the program's code could write:
    ``repr()`` of a key that is not a plain builtin value (``str``, ``int``, a tuple of
    those...) is shown as ``<type object>``.

    Dumps nobody called for from the program's code (at exit, on SIGTERM, on a signal,
    periodic, at the memory limit) run at moments the program does not choose: a
    ``__repr__`` that takes a lock the interrupted code holds would wait for ever, so
    they name keys without running one."""

    def __enter__(self):
        ident = _thread.get_ident()
        _no_user_code[ident] = _no_user_code.get(ident, 0) + 1

    def __exit__(self, *exc_info):
        ident = _thread.get_ident()
        depth = _no_user_code.pop(ident, 1) - 1
        if depth:
            _no_user_code[ident] = depth


def _plain(value, depth=2):
    """Whether *value*'s repr runs no code of the program's."""
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return True
    return (
        kind in (tuple, frozenset)
        and depth > 0
        and len(value) <= 8
        and all(_plain(item, depth - 1) for item in value)
    )


def _short_repr(value):
    """``repr(value)``, cut to a readable length; a placeholder if repr raises or cheats, or
    would run the program's code inside :class:`without_user_code`."""
    if type(value) in (str, bytes) and len(value) > _REPR_LIMIT:
        # Only what is shown: the repr of a huge key would copy it whole.
        value = value[:_REPR_LIMIT]
    if _no_user_code and _thread.get_ident() in _no_user_code and not _plain(value):
        return f"<{_type_name(value)} object>"
    try:
        text = repr(value)
        if not isinstance(text, str):
            raise TypeError("__repr__ returned a non-string")
    except Exception:
        return f"<{_type_name(value)} object>"
    if len(text) > _REPR_LIMIT:
        text = text[: _REPR_LIMIT - 3] + "..."
    return text


def _dict_items(d):
    """A copy of a dict's items, without calling methods a subclass may override."""
    return list(dict.items(d))


def _instance_dict(obj):
    try:
        d = object.__getattribute__(obj, "__dict__")
    except Exception:
        return None
    return d if isinstance(d, dict) else None


_MISSING = object()
# While reports are named (see _naming), per dict id: (the dict, {id(value): first key}).
_key_index = None


class _naming:
    """Shares dict scans between all the paths named inside: a dict on many paths (a
    module's globals, a cache holding every object of a site) is scanned once, not once
    per edge named through it.

    A class, not contextlib.contextmanager: importing alloctrace loads neither contextlib
    nor threading, so a program importing them after start() is charged for them as under
    tracemalloc."""

    def __enter__(self):
        global _key_index
        self._outer = _key_index
        if _key_index is None:
            _key_index = {}

    def __exit__(self, *exc_info):
        global _key_index
        _key_index = self._outer


def _key_of(d, value):
    """The key under which dict *d* holds *value*: ``(True, key)`` or ``(False, None)``."""
    if _key_index is None:
        for k, v in _dict_items(d):
            if v is value:
                return True, k
        return False, None
    entry = _key_index.get(id(d))
    if entry is None or entry[0] is not d:
        index = {}
        for k, v in _dict_items(d):
            index.setdefault(id(v), k)
        # The dict is held with its index, so its id cannot be reused meanwhile.
        entry = _key_index[id(d)] = (d, index)
    key = entry[1].get(id(value), _MISSING)
    return (False, None) if key is _MISSING else (True, key)


def _slot_name(obj, value):
    """The ``__slots__`` member of *obj* that holds *value*, if any."""
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__")
        if slots is None:
            continue
        if isinstance(slots, str):
            slots = (slots,)
        for name in slots:
            descriptor = cls.__dict__.get(name)
            if isinstance(descriptor, types.MemberDescriptorType):
                try:
                    if descriptor.__get__(obj, type(obj)) is value:
                        return name
                except Exception:
                    continue
    return None


def _frame_label(frame, thread_names, thread_of):
    """``thread NAME frame FILE:LINE in FUNC`` for a thread's frame."""
    try:
        code = frame.f_code
        where = f"frame {code.co_filename}:{frame.f_lineno} in {code.co_name}"
    except Exception:
        where = "frame"
    ident = thread_of.get(id(frame))
    if ident is None:
        return where
    return f"thread {thread_names.get(ident, ident)} {where}"


class _Roots:
    """The root objects of a heap walk and the label of each."""

    def __init__(self):
        self.objects = []
        self.labels = {}  # id(root) -> label
        self.kinds = {}  # id(root) -> "module" | "frame" | "locals"
        for name, module in list(sys.modules.items()):
            if isinstance(module, types.ModuleType) and id(module) not in self.labels:
                self.objects.append(module)
                self.labels[id(module)] = str(name)
                self.kinds[id(module)] = "module"
        # threading only if the program imported it: importing it here would charge its
        # code (about 320 KiB on 3.11) to the line that asked. Without it, threads have no
        # names, and _thread (built in, always loaded) gives the asking thread's id.
        import _thread

        threading = sys.modules.get("threading")
        thread_names = {t.ident: t.name for t in threading.enumerate()} if threading else {}
        thread_of = {}
        own, mine, others = _own_frames(), [], []
        current = _thread.get_ident()
        for ident, frame in sys._current_frames().items():
            while frame is not None:
                if id(frame) not in own:
                    (mine if ident == current else others).append(frame)
                    thread_of[id(frame)] = ident
                frame = frame.f_back
        self._add_frames(others, thread_names, thread_of)
        # The asking thread's frames come last (the native search takes them as a second
        # tier): they hold the object to ask about it.
        self.primary = len(self.objects)
        self._add_frames(mine, thread_names, thread_of)

    def _add_frames(self, frames, thread_names, thread_of):
        for frame in frames:
            label = _frame_label(frame, thread_names, thread_of)
            self.objects.append(frame)
            self.labels[id(frame)] = label
            self.kinds[id(frame)] = "frame"
            if _MODERN_FRAMES:
                try:
                    local_vars = dict(frame.f_locals)
                except Exception:
                    continue
                self.objects.append(local_vars)
                self.labels[id(local_vars)] = label
                self.kinds[id(local_vars)] = "locals"


def _own_frames():
    """The ids of this thread's alloctrace frames (innermost ones, up to the caller's)."""
    skip = set()
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        skip.add(id(frame))
        frame = frame.f_back
    return skip


class Edge:
    """One step of a reference chain: *referrer* refers to *referent*, read as *label*.

    *referrer_type* and *referent_type* are qualified type names; *label* is how the
    reference reads in code (``dict['users']``, ``list[3]``, ``User.__dict__['history']``,
    ``app.cache.users`` for a module global, ``local 'items'`` for a frame's local).
    """

    __slots__ = ("label", "referrer_type", "referent_type")

    def __init__(self, label, referrer_type, referent_type):
        self.label = label
        self.referrer_type = referrer_type
        self.referent_type = referent_type

    def __repr__(self):
        return f"<Edge {self.label!r}: {self.referrer_type} -> {self.referent_type}>"

    def __eq__(self, other):
        if not isinstance(other, Edge):
            return NotImplemented
        return (self.label, self.referrer_type, self.referent_type) == (
            other.label,
            other.referrer_type,
            other.referent_type,
        )

    __hash__ = None


class ReferrerPath:
    """A chain of references from a root to an object.

    *root* is the root's label (``module app.cache``, ``thread MainThread frame app.py:12 in
    handler``); *root_kind* is ``'module'`` or ``'frame'``; *edges* are the :class:`Edge`
    steps from the root to the object (empty when the object is a root itself). ``str()`` reads
    ``app.cache.users → list[3] → User.__dict__['history']``.
    """

    __slots__ = ("root", "root_kind", "edges", "_text")

    def __init__(self, root, root_kind, edges, text):
        self.root = root
        self.root_kind = root_kind
        self.edges = edges
        self._text = text

    def __str__(self):
        return self._text

    def __repr__(self):
        return f"<ReferrerPath {self._text!r}>"

    def __len__(self):
        return len(self.edges)


def _name_edges(path, i):
    """Names the reference from ``path[i]`` to ``path[i + 1]``: ``(label, steps)``, where
    *steps* edges are consumed (a module's or instance's ``__dict__`` and a closure's cell are
    folded into the next step, so the chain reads like code)."""
    a, b = path[i], path[i + 1]
    c = path[i + 2] if i + 2 < len(path) else None
    if isinstance(a, types.ModuleType):
        name = getattr(a, "__name__", None)
        name = name if isinstance(name, str) else "?"
        if c is not None and b is _instance_dict(a):
            found, key = _key_of(b, c)
            if found:
                return (
                    f"{name}.{str.__str__(key)}"
                    if isinstance(key, str)
                    else f"{name}[{_short_repr(key)}]"
                ), 2
        return None, 1
    if isinstance(a, types.FrameType):
        try:
            found, key = _key_of(dict(a.f_locals), b)
        except Exception:
            found = False
        if found:
            return f"local {_short_repr(key)}", 1
        if b is getattr(a, "f_globals", None):
            return "f_globals", 1
        if b is a.f_back:
            return "f_back", 1
        if _MODERN_FRAMES and b is not a.f_trace:
            # From 3.11 the walk links a running frame to nothing but f_back, f_trace and the
            # temporaries on its evaluation stack.
            return "stack temporary", 1
        return None, 1
    if isinstance(a, types.FunctionType):
        closure = a.__closure__
        if closure is not None and b is closure and c is not None and i + 3 < len(path):
            d = path[i + 3]
            names = a.__code__.co_freevars
            for index, cell in enumerate(closure):
                if cell is c and index < len(names):
                    try:
                        held = cell.cell_contents
                    except ValueError:
                        break
                    if held is d:
                        return f"<closure {a.__qualname__}>.cell {names[index]!r}", 3
        if b is a.__globals__:
            return f"{a.__qualname__}.__globals__", 1
        if b is a.__defaults__:
            return f"{a.__qualname__}.__defaults__", 1
        if b is a.__kwdefaults__:
            return f"{a.__qualname__}.__kwdefaults__", 1
    if isinstance(a, type):
        if isinstance(b, dict) and c is not None:
            found, key = _key_of(b, c)
            if found and isinstance(key, str) and a.__dict__.get(key) is c:
                return f"{a.__qualname__}.{str.__str__(key)}", 2
    if isinstance(a, dict):
        found, key = _key_of(a, b)
        if found:
            return f"{_type_name(a)}[{_short_repr(key)}]", 1
        for k, _ in _dict_items(a):
            if k is b:
                return f"{_type_name(a)} key {_short_repr(k)}", 1
        return None, 1
    if isinstance(a, (list, tuple)):
        items = list.copy(a) if isinstance(a, list) else tuple.__getitem__(a, slice(None))
        for index, item in enumerate(items):
            if item is b:
                return f"{_type_name(a)}[{index}]", 1
        return None, 1
    if isinstance(a, (set, frozenset)):
        return f"{_type_name(a)} member", 1
    if isinstance(a, types.CellType):
        return "cell contents", 1
    if b is type(a):
        return "__class__", 1
    attrs = _instance_dict(a)
    if attrs is not None:
        if c is not None and b is attrs:
            found, key = _key_of(attrs, c)
            if found:
                return f"{type(a).__qualname__}.__dict__[{_short_repr(key)}]", 2
        # 3.11+ keeps instance attributes inline, not in a dict object: look them up.
        found, key = _key_of(attrs, b)
        if found:
            return f"{type(a).__qualname__}.__dict__[{_short_repr(key)}]", 1
    slot = _slot_name(a, b)
    if slot is not None:
        return f"{type(a).__qualname__}.{slot}", 1
    return None, 1


def _render(path, roots):
    """A :class:`ReferrerPath` for a chain of live objects, root first."""
    root = path[0]
    kind = roots.kinds.get(id(root), "object")
    label = roots.labels.get(id(root), _type_name(root))
    if kind == "module":
        segments = [f"module {label}"]
    elif kind == "locals":
        segments = [label]
        kind = "frame"
    else:
        segments = [label]
    edges = []
    i = 0
    while i < len(path) - 1:
        a = path[i]
        try:
            name, steps = _name_edges(path, i)
        except Exception:
            name, steps = None, 1
        steps = max(1, min(steps, len(path) - 1 - i))
        b = path[i + steps]
        if name is None:
            name = f"<{_type_name(a)} → {_type_name(b)}>"
        if i == 0 and kind == "frame" and roots.kinds.get(id(root)) == "locals":
            try:
                found, key = _key_of(root, path[1])
            except Exception:
                found = False
            if found:
                name = f"local {_short_repr(key)}"
        edges.append(Edge(name, _type_name(a), _type_name(b)))
        if i == 0 and kind == "frame" and name.startswith("local "):
            segments[0] = f"{segments[0]}, {name}"
        elif i == 0 and kind == "module" and steps == 2 and isinstance(a, types.ModuleType):
            segments[0] = name
        else:
            segments.append(name)
        i += steps
    return ReferrerPath(label, kind, tuple(edges), " → ".join(segments))


def _with_gc_off(call):
    """Runs *call* with the collector off: the chains it returns must stay valid objects."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        return call()
    finally:
        if was_on:
            gc.enable()


class Retention:
    """Why one object is alive, as :func:`retention` returns it.

    *type* is the object's qualified type name; *size* the bytes it owns itself;
    *retained_size* the bytes that would be freed if it were released (itself and everything
    reachable only through it; 0 when no root reaches it); *reachable* whether a root other
    than the asking thread's frames reaches it (false for garbage in a reference cycle and
    for objects only the asking thread's locals hold); *paths* the :class:`ReferrerPath`
    chains (shortest first, each through a different last referrer); *traceback* where the
    object was allocated (a :class:`~alloctrace.Traceback`, ``None`` when not tracing or not
    traced).
    """

    __slots__ = ("type", "size", "retained_size", "reachable", "paths", "traceback")

    def __init__(self, type, size, retained_size, reachable, paths, traceback):
        self.type = type
        self.size = size
        self.retained_size = retained_size
        self.reachable = reachable
        self.paths = paths
        self.traceback = traceback

    def __str__(self):
        head = f"{self.type}: size={_format_size(self.size, False)}, "
        head += f"retained={_format_size(self.retained_size, False)}"
        if not self.reachable:
            head += (
                ", unreachable from every root but this thread's frames"
                " (garbage in a reference cycle, or held only here)"
            )
        if self.traceback is not None:
            head += f", allocated at {self.traceback[-1]}"
        return "\n".join([head] + [f"  {p}" for p in self.paths])

    def __repr__(self):
        return (
            f"<Retention {self.type} size={self.size} retained_size={self.retained_size}"
            f" paths={len(self.paths)}>"
        )


def _check_limit(limit):
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")


def retention(obj, limit=3):
    """Explain why *obj* is alive: a :class:`Retention` with up to *limit* paths and sizes.

    Walks the whole heap once (about a second per million objects). Works whether or not
    tracing is on.
    """
    _check_limit(limit)
    roots = _Roots()

    def analyse():
        chains, own, retained, reachable = _native.object_retention(
            roots.objects, roots.primary, obj, limit
        )
        with _naming():
            return [_render(chain, roots) for chain in chains], own, retained, reachable

    paths, own, retained, reachable = _with_gc_off(analyse)
    frames = _native.get_object_traceback(obj)
    traceback = Traceback(frames) if frames is not None else None
    return Retention(_type_name(obj), own, retained, reachable, paths, traceback)


def referrer_paths(obj, limit=3):
    """The shortest reference chains from a root to *obj*, as :class:`ReferrerPath` objects.

    At most *limit* paths, each ending in a different referrer of *obj*, nearest first.
    """
    _check_limit(limit)
    return retention(obj, limit).paths


def retained_size(obj):
    """The bytes that releasing *obj* would free: itself and all it alone keeps alive."""
    return retention(obj, 0).retained_size


def _site_text(site):
    return f" ({site[0]}:{site[1]})" if site is not None else ""


def _pattern_line(line):
    kind, site, count, held, up = line
    text = f"{held:,} held by {count:,} × {kind}{_site_text(site)}"
    if up:
        text += ", held by " + ", ".join(f"{n:,} × {k}{_site_text(s)}" for k, s, n in up)
    return text


def _capture(snapshot, top, baseline, limit):
    """Retention reports for a snapshot's *top* sites by size, or by growth since *baseline*."""

    def ours(stat):
        # alloctrace's own allocations (this capture's) are not what the user asks about.
        return stat.traceback[-1].filename.startswith(_PACKAGE_DIR)

    if baseline is None:
        stats = [s for s in snapshot.statistics("lineno") if s.size > 0 and not ours(s)]
    else:
        diffs = snapshot.compare_to(baseline, "lineno")
        diffs.sort(key=lambda d: d.size_diff, reverse=True)
        stats = [d for d in diffs if d.size_diff > 0 and not ours(d)]
    stats = stats[:top]
    sites = [(s.traceback[-1].filename, s.traceback[-1].lineno) for s in stats]
    return capture_sites(sites, limit)


def capture_sites(sites, limit=3, max_lines=5):
    """Retention reports for allocation sites ``(filename, lineno)``: a list of dicts in the
    shape of the snapshot file's retention section (sites with no live object left out)."""
    roots = _Roots()

    def analyse():
        found = _native.site_retention(roots.objects, roots.primary, list(sites), limit, max_lines)
        with _naming():
            out = []
            for (filename, lineno), report in zip(sites, found):
                if report is None:
                    continue
                count, unreachable, own, retained, chains, pattern = report
                out.append(
                    {
                        "filename": filename,
                        "lineno": lineno,
                        "count": count,
                        "unreachable": unreachable,
                        "size": own,
                        "retained": retained,
                        "paths": [str(_render(chain, roots)) for chain in chains],
                        "pattern": [_pattern_line(line) for line in pattern],
                    }
                )
            return out

    return _with_gc_off(analyse)
