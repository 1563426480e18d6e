"""Snapshot value types with the same interface and behaviour as :mod:`tracemalloc`'s.

:class:`Snapshot`, :class:`Trace`, :class:`Traceback`, :class:`Frame`, :class:`Statistic`,
:class:`StatisticDiff`, :class:`Filter` and :class:`DomainFilter` answer, print, compare and
sort exactly as their :mod:`tracemalloc` namesakes. The difference is underneath: a snapshot's
traces live in Rust (``alloctrace._native.SnapshotData``), interned by traceback, so grouping,
diffing, filtering, dumping and loading never loop over traces in Python. Python objects are
made only for what is indexed or iterated and for result rows.

Snapshot files are a compact, versioned, checksummed binary format (never pickle);
``Snapshot.load(filename, allow_pickle=True)`` also reads files written by
``tracemalloc.Snapshot.dump``.
"""

import linecache
import os
import pickle
import stat
from collections.abc import Iterable, Sequence
from functools import total_ordering

from alloctrace import _process
from alloctrace._native import (
    NATIVE_DOMAIN,
    NATIVE_DOMAIN_NAME,
    SnapshotData,
    SnapshotFormatError,
    fnmatch_filename,
)

__all__ = [
    "BaseFilter",
    "DomainFilter",
    "Filter",
    "Frame",
    "SiteRetention",
    "Snapshot",
    "SnapshotFormatError",
    "Statistic",
    "StatisticDiff",
    "Trace",
    "Traceback",
]


def _format_size(size, sign):
    """Human-readable size as tracemalloc prints it (``"12.3 KiB"``, ``"+5 B"``)."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    for index, unit in enumerate(units):
        last = index == len(units) - 1
        if unit != "B" and abs(size) < 100:
            return ("%+.1f %s" if sign else "%.1f %s") % (size, unit)
        if last or abs(size) < 10 * 1024:
            break
        size /= 1024
    return ("%+.0f %s" if sign else "%.0f %s") % (size, unit)


@total_ordering
class Frame:
    """One frame of a traceback: a ``(filename, lineno)`` pair."""

    __slots__ = ("_frame",)

    def __init__(self, frame):
        # frame is the raw (filename, lineno) tuple
        self._frame = frame

    @property
    def filename(self):
        return self._frame[0]

    @property
    def lineno(self):
        return self._frame[1]

    def __eq__(self, other):
        if not isinstance(other, Frame):
            return NotImplemented
        return self._frame == other._frame

    def __lt__(self, other):
        if not isinstance(other, Frame):
            return NotImplemented
        return self._frame < other._frame

    def __hash__(self):
        return hash(self._frame)

    def __str__(self):
        return f"{self.filename}:{self.lineno}"

    def __repr__(self):
        return f"<Frame filename={self.filename!r} lineno={self.lineno!r}>"


@total_ordering
class Traceback(Sequence):
    """Frames of one allocation, from the oldest call to the most recent one.

    *frames* is given most recent first (the order of raw traces) and stored reversed.
    *total_nframe* is the depth of the stack the frames were cut from, or ``None``.
    """

    __slots__ = ("_frames", "_total_nframe")

    def __init__(self, frames, total_nframe=None):
        Sequence.__init__(self)
        self._frames = tuple(reversed(frames))
        self._total_nframe = total_nframe

    @property
    def total_nframe(self):
        return self._total_nframe

    def __len__(self):
        return len(self._frames)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(Frame(frame) for frame in self._frames[index])
        return Frame(self._frames[index])

    def __contains__(self, frame):
        return frame._frame in self._frames

    def __hash__(self):
        return hash(self._frames)

    def __eq__(self, other):
        if not isinstance(other, Traceback):
            return NotImplemented
        return self._frames == other._frames

    def __lt__(self, other):
        if not isinstance(other, Traceback):
            return NotImplemented
        return self._frames < other._frames

    def __str__(self):
        return str(self[0])

    def __repr__(self):
        frames = tuple(self)
        if self._total_nframe is None:
            return f"<Traceback {frames}>"
        return f"<Traceback {frames} total_nframe={self._total_nframe}>"

    def format(self, limit=None, most_recent_first=False):
        """Lines like the interpreter's tracebacks, with source lines from :mod:`linecache`.

        A positive *limit* keeps the *limit* most recent frames, a negative one the oldest.
        """
        if limit is None:
            frames = list(self)
        elif limit > 0:
            frames = list(self[-limit:])
        else:
            frames = list(self[:limit])
        if most_recent_first:
            frames.reverse()
        lines = []
        for frame in frames:
            lines.append(f'  File "{frame.filename}", line {frame.lineno}')
            # looked up at call time so that patching linecache.getline takes effect; a NUL
            # (no file has one) makes linecache raise on 3.11 and 3.12
            source = (
                ""
                if "\0" in frame.filename
                else linecache.getline(frame.filename, frame.lineno).strip()
            )
            if source:
                lines.append(f"    {source}")
        return lines


class Trace:
    """One traced memory block: its domain, size and traceback."""

    __slots__ = ("_trace",)

    def __init__(self, trace):
        # trace is the raw (domain, size, frames[, total_nframe]) tuple
        self._trace = trace

    @property
    def domain(self):
        return self._trace[0]

    @property
    def size(self):
        return self._trace[1]

    @property
    def traceback(self):
        return Traceback(*self._trace[2:])

    def __eq__(self, other):
        if not isinstance(other, Trace):
            return NotImplemented
        return self._trace == other._trace

    def __hash__(self):
        return hash(self._trace)

    def __str__(self):
        return f"{self.traceback}: {_format_size(self.size, False)}"

    def __repr__(self):
        return (
            f"<Trace domain={self.domain} size={_format_size(self.size, False)}, "
            f"traceback={self.traceback!r}>"
        )


class _Traces(Sequence):
    """The traces of a snapshot as a sequence of :class:`Trace`, made on access."""

    def __init__(self, data):
        Sequence.__init__(self)
        self._data = data
        self._raw = None

    @property
    def _traces(self):
        """The raw trace tuples (a list, built once); equal tracebacks share one tuple."""
        if self._raw is None:
            self._raw = self._data.raw_traces()
        return self._raw

    def __len__(self):
        return len(self._data)

    def __getitem__(self, index):
        if isinstance(index, slice):
            if self._raw is not None:
                return tuple(Trace(trace) for trace in self._raw[index])
            return tuple(Trace(self._data.trace(i)) for i in range(len(self._data))[index])
        if self._raw is not None:
            return Trace(self._raw[index])
        return Trace(self._data.trace(index))

    def __iter__(self):
        for trace in self._traces:
            yield Trace(trace)

    def __contains__(self, trace):
        return trace._trace in self._traces

    def __eq__(self, other):
        if not isinstance(other, _Traces):
            return NotImplemented
        return self._data.traces_equal(other._data)

    __hash__ = None

    def __repr__(self):
        return f"<Traces len={len(self)}>"


def _normalize_filename(filename):
    filename = os.path.normcase(filename)
    if filename.endswith(".pyc"):
        filename = filename[:-1]
    return filename


class BaseFilter:
    """Base class of trace filters; subclasses define ``_match(trace)`` on raw traces."""

    def __init__(self, inclusive):
        self.inclusive = inclusive


class Filter(BaseFilter):
    """Keep (*inclusive*) or drop traces whose filename matches an :mod:`fnmatch` pattern.

    *lineno* restricts the match to one line; with *all_frames* any frame of the traceback
    may match, otherwise only the most recent one; *domain* restricts it to one address space.
    """

    def __init__(self, inclusive, filename_pattern, lineno=None, all_frames=False, domain=None):
        super().__init__(inclusive)
        self.inclusive = inclusive
        self._filename_pattern = _normalize_filename(filename_pattern)
        self.lineno = lineno
        self.all_frames = all_frames
        self.domain = domain

    @property
    def filename_pattern(self):
        return self._filename_pattern

    def _spec(self):
        return (
            "filename",
            bool(self.inclusive),
            self._filename_pattern,
            self.lineno,
            bool(self.all_frames),
            self.domain,
        )

    def _match_frame_impl(self, filename, lineno):
        if not fnmatch_filename(_normalize_filename(filename), self._filename_pattern):
            return False
        return self.lineno is None or lineno == self.lineno

    def _match_frame(self, filename, lineno):
        return self._match_frame_impl(filename, lineno) ^ (not self.inclusive)

    def _match_traceback(self, traceback):
        if self.all_frames:
            hit = any(self._match_frame_impl(name, line) for name, line in traceback)
            return hit if self.inclusive else not hit
        filename, lineno = traceback[0]
        return self._match_frame(filename, lineno)

    def _match(self, trace):
        domain, traceback = trace[0], trace[2]
        res = self._match_traceback(traceback)
        if self.domain is None:
            return res
        if self.inclusive:
            return res and domain == self.domain
        return res or domain != self.domain


#: Domains known by name: ``"native"`` is :data:`alloctrace.NATIVE_DOMAIN`, where
#: ``start(native=True)`` records extensions' own ``malloc``/``mmap`` calls.
DOMAIN_NAMES = {NATIVE_DOMAIN_NAME: NATIVE_DOMAIN}


def domain_number(domain):
    """The domain number *domain* stands for: an integer, or a name of :data:`DOMAIN_NAMES`."""
    if isinstance(domain, str):
        try:
            return DOMAIN_NAMES[domain]
        except KeyError:
            known = ", ".join(repr(name) for name in DOMAIN_NAMES)
            raise TypeError(
                f"domain must be an int or a domain name ({known}), got the unknown name {domain!r}"
            ) from None
    return domain


class DomainFilter(BaseFilter):
    """Keep (*inclusive*) or drop the traces of one address space *domain*.

    *domain* is a number (0: Python's allocators; numpy's is
    ``numpy.lib.tracemalloc_domain``) or the name ``"native"`` for
    :data:`alloctrace.NATIVE_DOMAIN`; :attr:`domain` is always the number.
    """

    def __init__(self, inclusive, domain):
        super().__init__(inclusive)
        self._domain = domain_number(domain)

    @property
    def domain(self):
        return self._domain

    def _spec(self):
        return ("domain", bool(self.inclusive), self._domain)

    def _match(self, trace):
        return (trace[0] == self._domain) ^ (not self.inclusive)


def _is_native_filter(trace_filter):
    """True for filters the Rust matcher can evaluate (their ``_match`` is ours)."""
    cls = type(trace_filter)
    if isinstance(trace_filter, Filter):
        return cls._match is Filter._match and cls._match_traceback is Filter._match_traceback
    if isinstance(trace_filter, DomainFilter):
        return cls._match is DomainFilter._match
    return False


class Statistic:
    """Memory allocated at one place (a traceback, a line or a file): total size and count.

    For the object-kind keys (``'type'`` and ``'lineno+type'``), *kind* names what the
    blocks are: an object's type (``'dict'``, ``'app.cache.User'``), a buffer named after
    its owner's type (``'list (items)'``), or ``'raw'``. It is ``None`` for the other keys.
    With ``'type'`` the traceback is empty (the blocks come from anywhere).
    """

    __slots__ = ("traceback", "size", "count", "kind")

    def __init__(self, traceback, size, count, kind=None):
        self.traceback = traceback
        self.size = size
        self.count = count
        self.kind = kind

    def __hash__(self):
        return hash((self.traceback, self.size, self.count, self.kind))

    def __eq__(self, other):
        if not isinstance(other, Statistic):
            return NotImplemented
        return (self.traceback, self.size, self.count, self.kind) == (
            other.traceback,
            other.size,
            other.count,
            other.kind,
        )

    def __str__(self):
        text = f"{_place(self.traceback, self.kind)}: size={_format_size(self.size, False)}, "
        text += f"count={self.count:d}"
        if self.count:
            text += f", average={_format_size(self.size / self.count, False)}"
        return text

    def __repr__(self):
        kind = "" if self.kind is None else f" kind={self.kind!r}"
        return (
            f"<Statistic traceback={self.traceback!r}{kind} size={self.size:d} "
            f"count={self.count:d}>"
        )

    def _sort_key(self):
        return (self.size, self.count, self.traceback)


def _place(traceback, kind):
    """What a statistic is about, for ``str()``: ``app.py:42``, ``app.py:42: dict``, ``dict``."""
    if kind is None:
        return str(traceback)
    if len(traceback):
        return f"{traceback}: {kind}"
    return kind


class StatisticDiff:
    """How the memory allocated at one place changed between an old and a new snapshot.

    *kind* is set for the object-kind keys, as in :class:`Statistic`.
    """

    __slots__ = ("traceback", "size", "size_diff", "count", "count_diff", "kind")

    def __init__(self, traceback, size, size_diff, count, count_diff, kind=None):
        self.traceback = traceback
        self.size = size
        self.size_diff = size_diff
        self.count = count
        self.count_diff = count_diff
        self.kind = kind

    def _fields(self):
        return (
            self.traceback,
            self.size,
            self.size_diff,
            self.count,
            self.count_diff,
            self.kind,
        )

    def __hash__(self):
        return hash(self._fields())

    def __eq__(self, other):
        if not isinstance(other, StatisticDiff):
            return NotImplemented
        return self._fields() == other._fields()

    def __str__(self):
        text = (
            f"{_place(self.traceback, self.kind)}: size={_format_size(self.size, False)} "
            f"({_format_size(self.size_diff, True)}), "
            f"count={self.count:d} ({self.count_diff:+d})"
        )
        if self.count:
            text += f", average={_format_size(self.size / self.count, False)}"
        return text

    def __repr__(self):
        kind = "" if self.kind is None else f" kind={self.kind!r}"
        return (
            f"<StatisticDiff traceback={self.traceback!r}{kind} size={self.size:d} "
            f"({self.size_diff:+d}) count={self.count:d} ({self.count_diff:+d})>"
        )

    def _sort_key(self):
        return (
            abs(self.size_diff),
            self.size,
            abs(self.count_diff),
            self.count,
            self.traceback,
        )


# Instance attributes that are the snapshot itself, not user attributes to dump.
_INTERNAL_ATTRIBUTES = frozenset({"_data", "_traces_view"})
_PICKLE_PROTOCOL_BYTES = {b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05"}


def _path(filename):
    """*filename* as ``str``: ``bytes`` and path-like objects are accepted, as by ``open()``."""
    path = os.fspath(filename)
    return os.fsdecode(path) if isinstance(path, bytes) else path


def _site_of(key):
    """``(filename, lineno)`` of an allocation site named by a string, frame or traceback."""
    if isinstance(key, (Statistic, StatisticDiff)):
        key = key.traceback
    if isinstance(key, Traceback):
        if not len(key):
            raise ValueError("the traceback has no frame to name an allocation site")
        key = key[-1]
    if isinstance(key, Frame):
        return key.filename, key.lineno
    if isinstance(key, str):
        filename, sep, line = key.rpartition(":")
        if not sep or not filename or not line.isdigit():
            raise ValueError(f"expected 'file:line' naming an allocation site, got {key!r}")
        return filename, int(line)
    raise TypeError(
        "an allocation site is named by a 'file:line' str, a Frame, a Traceback or a "
        f"Statistic, not {type(key).__name__}"
    )


class Snapshot:
    """Traces of the memory blocks allocated by Python at one moment.

    *traces* are raw ``(domain, size, frames[, total_nframe])`` tuples with frames most
    recent first, as ``tracemalloc._get_traces()`` returns them. With *sample_interval*
    (bytes), they are the samples of a sampled snapshot taken at that interval.

    A sampled snapshot (taken after ``start(sample_interval=...)``) holds only the sampled
    blocks: :attr:`traces` lists them with their true sizes, while :meth:`statistics`,
    :meth:`compare_to` and the exports weight each one by the inverse of its sampling
    probability, so their sizes and counts are unbiased estimates of the true totals
    (counts rounded to whole blocks per row).
    """

    def __init__(self, traces, traceback_limit, *, sample_interval=None):
        self._data = SnapshotData.from_raw(traces, traceback_limit, sample_interval)

    @classmethod
    def _from_data(cls, data):
        """Wrap a native ``SnapshotData`` (as ``take_snapshot`` and ``load`` make them)."""
        snapshot = cls.__new__(cls)
        snapshot._data = data
        return snapshot

    @property
    def traces(self):
        """The traces, a sequence of :class:`Trace`."""
        view = self.__dict__.get("_traces_view")
        if view is None:
            view = self._traces_view = _Traces(self._data)
        return view

    @property
    def traceback_limit(self):
        """The maximum number of frames stored in a traceback when the snapshot was taken."""
        return self._data.traceback_limit

    @property
    def sample_interval(self):
        """The sampling interval in bytes if the snapshot is sampled (its statistics are
        estimates), ``None`` if every block was traced."""
        return self._data.sample_interval

    @property
    def process_memory(self):
        """The process's resident memory when the snapshot was taken, a
        :class:`ProcessMemory`; ``None`` for snapshots that did not record it (hand-built ones,
        tracemalloc pickles, files from older versions)."""
        return _process._from_native(self._data.process_memory)

    @property
    def machine(self):
        """``(id, hostname)`` of the machine the snapshot was taken on, or ``None`` if it does
        not say (hand-built snapshots, tracemalloc pickles, files from older versions). The id
        is an alloctrace-specific hash of ``/etc/machine-id``, not the id itself; the commands
        show source lines only for snapshots of this machine (see ``alloctrace._source``). A
        file can claim any id: it tells where a file says it comes from, not who wrote it."""
        return self._data.machine

    @property
    def is_peak(self):
        """Whether this is a peak snapshot (``take_snapshot(peak=True)``): one trace per
        traceback, whose size is the total of the blocks it had alive at the peak; their
        count is in :meth:`statistics`. Such traces have no address, so nothing per block
        (object kinds, retention) is known."""
        return self._data.is_peak

    @property
    def peak(self):
        """The peak snapshot stored with this one in a dump (``ALLOCTRACE_DUMP`` writes the
        session's peak with each snapshot), or ``None``."""
        peak = self._data.peak
        return None if peak is None else Snapshot._from_data(peak)

    def _with_peak(self, peak):
        """A copy of this snapshot that :meth:`dump` writes with the peak snapshot *peak*."""
        return Snapshot._from_data(self._data.with_peak(peak._data))

    @property
    def has_objects(self):
        """Whether the snapshot records object kinds (``take_snapshot(objects=True)``), so
        that it can be grouped by ``'type'`` and ``'lineno+type'``."""
        return self._data.has_objects

    @property
    def metadata(self):
        """Where and when the snapshot was taken: a dict with ``python_version``,
        ``timestamp``, ``pid`` and ``argv`` (``None`` or ``[]`` where unknown)."""
        return self._data.metadata

    def _attributes(self):
        return {k: v for k, v in vars(self).items() if k not in _INTERNAL_ATTRIBUTES}

    def _set_attributes(self, attributes, source):
        """Set user attributes read from *source* (a file name), none of which may take the
        name of the snapshot's own attributes: a file must not change what the snapshot is."""
        for name in attributes:
            if _is_reserved_attribute(name):
                raise SnapshotFormatError(
                    f"{source} is not a readable alloctrace snapshot: its user attribute "
                    f"{name!r} has the name of a Snapshot attribute"
                )
        self.__dict__.update(attributes)

    def __reduce__(self):
        # The snapshot travels as the bytes of its file, so a pickle carries all that load()
        # would (a peak and its block counts, process memory, metadata, object kinds,
        # retention reports); the user attributes travel as the state, any picklable value.
        return (_unpickle, (type(self), self._data.dumps()), self._attributes())

    def __setstate__(self, state):
        # (attributes, retention reports): the state of pickles made before snapshots were
        # pickled as their file's bytes.
        if isinstance(state, tuple):
            state, reports = state
            self._data = self._data.with_retention(reports)
        self._set_attributes(state, "the pickle")

    def dump(self, filename):
        """Write the snapshot, with its plain-valued attributes, into a file.

        The file is replaced atomically: a failed dump leaves any previous file intact. It
        is synced to disk before it takes the name, so a crash cannot leave it empty. It is
        readable by its owner only (mode 0600, less the umask) unless ``ALLOCTRACE_FILE_MODE``
        (octal, e.g. ``0644``) says otherwise: a snapshot holds file paths, ``sys.argv`` and,
        with retention reports, the reprs of dict keys. A symbolic link at *filename* is
        followed only if it is the caller's own or root's; another user's link is replaced.
        An attribute named like one of the snapshot's own (``statistics``, ``__class__``,
        any dunder name...) is refused with ``ValueError``, as :meth:`load` would refuse it.
        """
        attributes = self._attributes()
        for name in attributes:
            if _is_reserved_attribute(name):
                raise ValueError(
                    f"cannot dump the snapshot attribute {name!r}: it has the name of a "
                    "Snapshot attribute, which load() refuses to set from a file"
                )
        self._data.dump(_path(filename), attributes)

    @staticmethod
    def load(filename, *, allow_pickle=False):
        """Load a snapshot written by :meth:`dump`.

        With *allow_pickle*, a snapshot written by ``tracemalloc.Snapshot.dump`` is loaded
        too; unpickling can execute arbitrary code, so only use it on trusted files.
        """
        filename = _path(filename)
        # Only a regular file is opened here: a FIFO or a device goes to the native reader,
        # which refuses it without blocking.
        if allow_pickle and stat.S_ISREG(os.stat(filename).st_mode):
            with open(filename, "rb") as fp:
                head = fp.read(2)
            if head in _PICKLE_PROTOCOL_BYTES:
                return _load_pickle(filename)
        data, attributes = SnapshotData.load(filename)
        snapshot = Snapshot._from_data(data)
        snapshot._set_attributes(attributes, filename)
        return snapshot

    @property
    def has_retention(self):
        """Whether the snapshot holds retention reports (see :meth:`referrer_paths`)."""
        return self._data.has_retention

    def referrer_paths(self, key):
        """The retention report captured for an allocation site, or ``None``.

        *key* names the site: a ``'file:line'`` string, a :class:`Frame`, or a
        :class:`Traceback` or :class:`Statistic`/:class:`StatisticDiff` (its most recent
        frame). The file may be the end of a path (``'app.py:42'``, ``'pkg/app.py:42'``),
        as with ``alloctrace why --line``; an end that matches several captured files raises
        :exc:`ValueError` naming them. Returns an :class:`alloctrace.SiteRetention` (what
        holds the site's objects, sample reference chains, retained size), or ``None`` when
        none was captured for that site. Raises :exc:`ValueError` if the snapshot holds no
        retention reports at all: take it with ``take_snapshot(retention=N)``, or dump at
        exit with ``ALLOCTRACE_OBJECTS=1``.
        """
        filename, lineno = _site_of(key)
        reports = self._data.retention
        if reports is None:
            raise ValueError(
                "this snapshot holds no retention reports: take it with "
                "alloctrace.take_snapshot(retention=N), or set ALLOCTRACE_OBJECTS=1 for dumps"
            )
        report = find_site_report(reports, filename, lineno)
        return None if report is None else SiteRetention(report)

    def _filter_trace(self, include_filters, exclude_filters, trace):
        if include_filters and not any(f._match(trace) for f in include_filters):
            return False
        return all(f._match(trace) for f in exclude_filters)

    def filter_traces(self, filters):
        """A new snapshot with the traces kept by *filters*, a sequence of
        :class:`Filter` and :class:`DomainFilter`: kept when it matches any inclusive
        filter (if there is one) and every exclusive filter.

        Retention reports (:meth:`referrer_paths`) are kept for the allocation sites the
        new snapshot still holds a trace allocated at (the trace's most recent frame), and
        dropped for the others. A kept report is unchanged: it describes every object of
        its site at capture time, whatever the filters keep."""
        if not isinstance(filters, Iterable):
            raise TypeError(f"filters must be a list of filters, not {type(filters).__name__}")
        filters = list(filters)
        for index, item in enumerate(filters):
            if not isinstance(item, BaseFilter):
                raise TypeError(
                    f"filters[{index}] must be a Filter or DomainFilter, not {type(item).__name__}"
                )
        if all(_is_native_filter(f) for f in filters):
            return Snapshot._from_data(self._data.filter([f._spec() for f in filters]))
        if self._data.is_peak:
            raise TypeError(
                "a peak snapshot can only be filtered by Filter and DomainFilter (its traces "
                "are per-traceback totals)"
            )
        # A user-defined filter: its _match has to see every raw trace.
        include = [f for f in filters if f.inclusive]
        exclude = [f for f in filters if not f.inclusive]
        kept = [t for t in self.traces._traces if self._filter_trace(include, exclude, t)]
        result = Snapshot(kept, self.traceback_limit, sample_interval=self.sample_interval)
        if self._data.has_retention:
            result._data = result._data.with_retention_of(self._data)
        return result

    def statistics(self, key_type, cumulative=False):
        """Statistics grouped by *key_type* (``'traceback'``, ``'lineno'`` or
        ``'filename'``), largest first. *cumulative* counts every frame of a traceback,
        not only the most recent one.

        Snapshots taken with ``take_snapshot(objects=True)`` also group by object kind:
        ``'type'`` (what the blocks are, wherever allocated) and ``'lineno+type'`` (per
        line and kind); each :class:`Statistic` then has its ``kind`` set. Those keys raise
        :exc:`ValueError` on a snapshot without object kinds, and with *cumulative*."""
        return _statistics(self._data.statistics(key_type, bool(cumulative)))

    def compare_to(self, old_snapshot, key_type, cumulative=False):
        """Differences against *old_snapshot*, grouped by *key_type*, biggest change
        first.

        Either snapshot may be sampled: each side then contributes its estimates (exact
        figures for an exact one), so the differences estimate the true change.
        The object-kind keys need both snapshots taken with ``objects=True``.
        """
        old = old_snapshot._data if isinstance(old_snapshot, Snapshot) else None
        if old is None:
            # A tracemalloc.Snapshot (or anything shaped like one) is compared by its traces.
            if not hasattr(getattr(old_snapshot, "traces", None), "_traces"):
                raise TypeError(
                    f"old_snapshot must be a Snapshot, not {type(old_snapshot).__name__}"
                )
            old = SnapshotData.from_raw(old_snapshot.traces._traces, old_snapshot.traceback_limit)
        return _statistic_diffs(self._data.compare_to(old, key_type, bool(cumulative)))

    def to_pprof(self, filename):
        """Write the live memory as a gzipped pprof heap profile, for ``go tool pprof``
        and the profilers that read pprof: sample types ``inuse_objects`` and
        ``inuse_space``, one sample per distinct traceback, frames named by function
        where the snapshot recorded it."""
        self._data.to_pprof(_path(filename))

    def to_collapsed(self, filename):
        """Write folded stacks: one ``root;...;leaf size`` line per distinct traceback,
        oldest frame first, frames written as ``function (file:line)``."""
        self._data.to_collapsed(_path(filename))

    def to_flamegraph(self, filename, *, title=None, base=None):
        """Write an interactive SVG flamegraph of live memory by traceback.

        With *base*, an older snapshot, draw the growth since *base* instead: widths are
        the sizes now, red frames grew and blue ones shrank.
        """
        if base is not None:
            base = _snapshot_data(base, "base")
        if title is not None and not isinstance(title, str):
            raise TypeError(f"title must be a str or None, not {type(title).__name__}")
        self._data.to_flamegraph(_path(filename), base, title)


def _unpickle(cls, data):
    """Unpickle a :class:`Snapshot` (or subclass *cls*) from its file's bytes."""
    return cls._from_data(SnapshotData.loads(data, "the pickle"))


def _sampled_snapshot(traces, traceback_limit, sample_interval):
    """Unpickle a sampled :class:`Snapshot` from a pickle made before snapshots were pickled
    as their file's bytes (``__reduce__`` could not pass keywords)."""
    return Snapshot(traces, traceback_limit, sample_interval=sample_interval)


def _snapshot_data(snapshot, what):
    """The ``SnapshotData`` of one of our snapshots or of a ``tracemalloc.Snapshot``."""
    if isinstance(snapshot, Snapshot):
        return snapshot._data
    traces = getattr(getattr(snapshot, "traces", None), "_traces", None)
    if traces is None:
        raise TypeError(f"{what} must be a Snapshot, not {type(snapshot).__name__}")
    return SnapshotData.from_raw(traces, snapshot.traceback_limit)


# Result rows are built without running __init__: the frames already come oldest first, and
# for tens of thousands of rows the constructor calls would cost more than the analysis.
_new = object.__new__


def _traceback_of(frames):
    traceback = _new(Traceback)
    traceback._frames = frames
    traceback._total_nframe = None
    return traceback


def _statistics(rows):
    out = []
    append = out.append
    for row in rows:
        stat = _new(Statistic)
        stat.traceback = _traceback_of(row[0])
        stat.size = row[1]
        stat.count = row[2]
        stat.kind = row[3] if len(row) > 3 else None
        append(stat)
    return out


def _statistic_diffs(rows):
    out = []
    append = out.append
    for row in rows:
        diff = _new(StatisticDiff)
        diff.traceback = _traceback_of(row[0])
        diff.size = row[1]
        diff.size_diff = row[2]
        diff.count = row[3]
        diff.count_diff = row[4]
        diff.kind = row[5] if len(row) > 5 else None
        append(diff)
    return out


class _PickledTraces:
    """Stands in for ``tracemalloc._Traces`` while unpickling; keeps the raw list."""

    def __setstate__(self, state):
        self.state = state


class _PickledSnapshot:
    """Stands in for ``tracemalloc.Snapshot`` while unpickling; keeps its ``__dict__``."""

    def __setstate__(self, state):
        self.state = state


class _TracemallocUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "tracemalloc" and name == "Snapshot":
            return _PickledSnapshot
        if module == "tracemalloc" and name == "_Traces":
            return _PickledTraces
        return super().find_class(module, name)


def _load_pickle(filename):
    """A snapshot from a pickle file; whatever is wrong with the pickle (truncated, of
    another class, of the wrong shape) is a :class:`SnapshotFormatError`."""
    with open(filename, "rb") as fp:
        try:
            return _snapshot_from_pickle(filename, fp)
        except (SnapshotFormatError, MemoryError):
            raise
        except Exception as exc:
            raise SnapshotFormatError(
                f"{filename} is not a readable snapshot pickle: {type(exc).__name__}: {exc}"
            ) from exc


def _snapshot_from_pickle(filename, fp):
    loaded = _TracemallocUnpickler(fp).load()
    if isinstance(loaded, Snapshot):
        return loaded
    if not isinstance(loaded, _PickledSnapshot):
        raise SnapshotFormatError(
            f"{filename} is a pickle, but not of a tracemalloc.Snapshot "
            f"(it holds a {type(loaded).__name__})"
        )
    state = dict(loaded.state)
    traces = state.pop("traces", None)
    limit = state.pop("traceback_limit", None)
    if not isinstance(traces, _PickledTraces) or limit is None:
        raise SnapshotFormatError(f"{filename} is a pickled tracemalloc.Snapshot without traces")
    snapshot = Snapshot(traces.state.get("_traces", ()), limit)
    snapshot._set_attributes(state, filename)
    return snapshot


def _is_reserved_attribute(name):
    """Whether *name* is the snapshot's own (a property, a method, internal state or any
    dunder name), which no attribute from a file may replace."""
    return (
        name in _INTERNAL_ATTRIBUTES
        or hasattr(Snapshot, name)
        or (name.startswith("__") and name.endswith("__"))
    )


def totals(snapshot):
    """``(size, count)`` of all of *snapshot*'s traces: grouping by file counts each block
    exactly once (estimates, for a sampled snapshot), as ``alloctrace stats`` sums them."""
    stats = snapshot.statistics("filename")
    return sum(stat.size for stat in stats), sum(stat.count for stat in stats)


def find_site_report(reports, filename, lineno):
    """The report among *reports* (dicts with ``filename`` and ``lineno``) for the site
    *filename*:*lineno*, or ``None``: the one rule by which :meth:`Snapshot.referrer_paths`
    and ``alloctrace why --line`` name a site.

    *filename* is a full path or the end of one, cut at a ``/`` (``app.py``,
    ``pkg/app.py``). A report whose file is exactly *filename* wins; otherwise the reports
    whose file ends with it match, and more than one distinct file matching is a
    :exc:`ValueError` naming them.
    """
    at_line = [r for r in reports if r["lineno"] == lineno]
    for report in at_line:
        if report["filename"] == filename:
            return report
    tail = "/" + filename.lstrip("/")
    matches = [r for r in at_line if r["filename"].endswith(tail)]
    files = sorted({r["filename"] for r in matches})
    if len(files) > 1:
        raise ValueError(
            f"{filename}:{lineno} is ambiguous: it matches "
            + ", ".join(f"{f}:{lineno}" for f in files)
            + "; give more of the path"
        )
    return matches[0] if matches else None


class SiteRetention:
    """Why the objects allocated at one line are alive, as captured in a snapshot.

    A record of the snapshot (its retention section); ``_retention`` captures it.

    *filename* and *lineno* name the allocation site; *count* is how many live objects were
    found there, *unreachable* how many of them no root reaches; *size* their own bytes
    together, *retained_size* what releasing all of them would free; *paths* sample reference
    chains (str), *pattern* what holds them, grouped by the holder's type and allocation site
    (str lines, largest first).
    """

    __slots__ = (
        "filename",
        "lineno",
        "count",
        "unreachable",
        "size",
        "retained_size",
        "paths",
        "pattern",
    )

    def __init__(self, report):
        self.filename = report["filename"]
        self.lineno = report["lineno"]
        self.count = report["count"]
        self.unreachable = report["unreachable"]
        self.size = report["size"]
        self.retained_size = report["retained"]
        self.paths = list(report["paths"])
        self.pattern = list(report["pattern"])

    def __str__(self):
        lines = [
            f"{self.filename}:{self.lineno}: {self.count:,} live objects, "
            f"size={_format_size(self.size, False)}, "
            f"retained={_format_size(self.retained_size, False)}"
            + (f", {self.unreachable:,} unreachable" if self.unreachable else "")
        ]
        if self.pattern:
            lines.append("held by:")
            lines.extend(f"  {line}" for line in self.pattern)
        if self.paths:
            lines.append("paths:")
            lines.extend(f"  {path}" for path in self.paths)
        return "\n".join(lines)

    def __repr__(self):
        return f"<SiteRetention {self.filename}:{self.lineno} count={self.count}>"

    def _json(self):
        return {
            "filename": self.filename,
            "lineno": self.lineno,
            "count": self.count,
            "unreachable": self.unreachable,
            "size": self.size,
            "retained_size": self.retained_size,
            "pattern": self.pattern,
            "paths": self.paths,
        }
