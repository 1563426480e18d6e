"""Continuous memory profiles pushed to a Pyroscope-compatible server.

Every *interval* seconds a background thread takes a snapshot (the only step that holds the
GIL), turns it into a pprof heap profile in Rust without the GIL, and sends it over HTTP (whose
socket calls release the GIL). The program never waits for the network, except once at exit
for the last profile, bounded by the timeout.

Two APIs are spoken, as Grafana Pyroscope documents them:

- Connect: ``POST {base}/push.v1.PusherService/Push``, ``Content-Type: application/proto``,
  ``Content-Encoding: gzip``, the body a ``push.v1.PushRequest`` (``api/push/v1/push.proto``)
  holding one series: the labels and one raw pprof profile. This is what the first push tries.
- The older ingest API: ``POST {base}/ingest?name=SERVICE{LABELS}&from=S&until=S&format=pprof``
  with the gzipped profile as the body. Used once the server answers the Connect push with 404,
  405 or 415 (no such procedure), or with a success that is not ``application/proto``, and the
  ingest request then succeeds; the choice is kept for the rest of the process.

Failures never reach the program: connection errors, timeouts, 429 and 5xx answers keep the
profile queued (at most :data:`QUEUE_MAX`, the oldest dropped and counted) and retry with a
doubling backoff; other answers drop the profile. The first failure prints one line on stderr;
later ones are only counted (:func:`get_push_status`). Credentials are sent in headers only:
they are never printed, logged, or put in a label or a snapshot.
"""

from __future__ import annotations

import base64
import os
import sys
import time
from urllib.parse import quote, unquote, urlsplit

from alloctrace import _native, _threads

ENV_PUSH = "ALLOCTRACE_PUSH"
ENV_PUSH_INTERVAL = "ALLOCTRACE_PUSH_INTERVAL"
ENV_PUSH_TIMEOUT = "ALLOCTRACE_PUSH_TIMEOUT"
ENV_SERVICE = "ALLOCTRACE_SERVICE"
ENV_TAGS = "ALLOCTRACE_TAGS"
ENV_PUSH_USER = "ALLOCTRACE_PUSH_USER"
ENV_PUSH_PASSWORD = "ALLOCTRACE_PUSH_PASSWORD"
ENV_PUSH_TOKEN = "ALLOCTRACE_PUSH_TOKEN"
ENV_PUSH_TENANT = "ALLOCTRACE_PUSH_TENANT"

#: The variables ``alloctrace run --push`` passes on to the program (it passes no other
#: ALLOCTRACE variable): credentials belong in variables, not on a command line.
PASSED_ON = (
    ENV_PUSH_INTERVAL,
    ENV_PUSH_TIMEOUT,
    ENV_SERVICE,
    ENV_TAGS,
    ENV_PUSH_USER,
    ENV_PUSH_PASSWORD,
    ENV_PUSH_TOKEN,
    ENV_PUSH_TENANT,
)

#: Seconds between profiles, unless ``ALLOCTRACE_PUSH_INTERVAL`` says otherwise.
DEFAULT_INTERVAL = 15.0
#: The shortest interval accepted: each profile is a pass over the trace table.
MIN_INTERVAL = 0.1
#: Seconds one request may take (connect, send, answer), unless ``ALLOCTRACE_PUSH_TIMEOUT``.
DEFAULT_TIMEOUT = 5.0
#: The sampling interval pushing uses unless one is given: Go's and pyroscope-io's.
DEFAULT_SAMPLE_INTERVAL = 512 * 1024
#: Frames per traceback when pushing from start-up and ``ALLOCTRACE`` does not say.
DEFAULT_NFRAME = 64
#: Profiles waiting for a server that does not answer; beyond it the oldest is dropped.
QUEUE_MAX = 8
#: First and largest wait before retrying after a failure, in seconds.
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0

CONNECT_PATH = "/push.v1.PusherService/Push"
INGEST_PATH = "/ingest"

_VERSION = "0.1.0"


class PushConfigError(ValueError):
    """A push setting (URL, variable or argument) that cannot be used."""


# --- settings ----------------------------------------------------------------------------


def _label_name_ok(name: str) -> bool:
    # Pyroscope's rule (api/model/labelset/validate.go): letters, digits, '_' and '.'.
    return bool(name) and all(c.isascii() and (c.isalnum() or c in "_.") for c in name)


def _service_name_ok(name: str) -> bool:
    return bool(name) and all(c.isascii() and (c.isalnum() or c in "_.-/") for c in name)


def default_service_name(argv0: str | None = None) -> str:
    """The program's name: the module of ``python -m``, else the script without ``.py``,
    else ``python``; cut to the characters Pyroscope accepts in a service name.

    Read when the first profile is labelled, not at start-up, when ``sys.argv`` and
    ``__main__`` do not yet say what runs."""
    name = ""
    if argv0 is None:
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        name = getattr(spec, "name", None) or ""
        if name.endswith(".__main__"):
            name = name[: -len(".__main__")]
        argv0 = sys.argv[0] if sys.argv and sys.argv[0] not in ("-c", "-m") else ""
    if not name:
        name = os.path.basename(argv0)
        if name.endswith(".py"):
            name = name[:-3]
        if name in ("", "__main__", "-"):
            name = "python"
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "_.-/") else "_" for c in name)
    return cleaned or "python"


def parse_tags(text: str, source: str = ENV_TAGS) -> dict[str, str]:
    """Parse ``k=v,k2=v2`` into a dict; names as Pyroscope accepts them."""
    tags: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not _label_name_ok(name):
            raise PushConfigError(
                f"{source}: {item[:100]!r} is not a tag NAME=VALUE with NAME made of letters, "
                "digits, '_' and '.'"
            )
        if name in RESERVED_LABELS:
            raise PushConfigError(f"{source}: the tag name {name!r} is set by alloctrace")
        tags[name] = value.strip()
    return tags


#: Labels alloctrace sets itself; a tag may not replace them.
RESERVED_LABELS = (
    "__name__",
    "service_name",
    "host",
    "pid",
    "process.runtime.name",
    "process.runtime.version",
    "alloctrace_version",
)


def _seconds(value, source: str, minimum: float) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not minimum <= seconds < float("inf"):
        raise PushConfigError(
            f"{source}={str(value)[:100]!r} is invalid: expected a number of seconds, at least "
            f"{minimum}"
        )
    return seconds


class Target:
    """Where profiles go and the headers that authenticate them.

    Its repr and :attr:`shown` never include credentials."""

    __slots__ = ("scheme", "host", "port", "base", "shown", "_headers")

    def __init__(
        self,
        url: str,
        *,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        tenant: str | None = None,
    ):
        if not isinstance(url, str):
            raise TypeError(f"push URL must be a str, not {type(url).__name__}")
        try:
            parts = urlsplit(url.strip())
            port = parts.port
        except ValueError as exc:
            raise PushConfigError(f"push URL is invalid: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PushConfigError(
                "push URL must be http://HOST[:PORT][/PATH] or https://..., e.g. "
                "http://localhost:4040"
            )
        if parts.query or parts.fragment:
            raise PushConfigError("push URL must not have a query or fragment")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = port or (443 if parts.scheme == "https" else 80)
        self.base = parts.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.shown = f"{self.scheme}://{host}:{self.port}{self.base}"
        if parts.username is not None:
            if user is not None:
                raise PushConfigError("push user given both in the URL and separately")
            user = unquote(parts.username)
            password = unquote(parts.password or "") if password is None else password
        headers: dict[str, str] = {}
        if user is not None:
            if token:
                raise PushConfigError("give either a push user and password or a token, not both")
            pair = f"{user}:{password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        elif token:
            if any(c in token for c in "\r\n"):
                raise PushConfigError("push token must be one line")
            headers["Authorization"] = f"Bearer {token}"
        elif password:
            raise PushConfigError("a push password needs a user")
        if tenant:
            if any(c in tenant for c in "\r\n"):
                raise PushConfigError("push tenant must be one line")
            headers["X-Scope-OrgID"] = tenant
        headers["User-Agent"] = f"alloctrace/{_VERSION}"
        self._headers = headers

    def __repr__(self) -> str:
        return f"<push target {self.shown}>"

    def headers(self) -> dict[str, str]:
        return dict(self._headers)


# --- wire format -------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def push_request(labels: dict[str, str], raw_profile: bytes, profile_id: str) -> bytes:
    """``push.v1.PushRequest{series: [RawProfileSeries{labels, samples: [RawSample]}]}``.

    Fields (api/push/v1/push.proto, types/v1/types.proto): PushRequest.series = 1;
    RawProfileSeries.labels = 1 (LabelPair name = 1, value = 2), .samples = 2;
    RawSample.raw_profile = 1, .ID = 2."""
    series = b"".join(
        _field(1, _field(1, name.encode()) + _field(2, value.encode()))
        for name, value in sorted(labels.items())
    )
    series += _field(2, _field(1, raw_profile) + _field(2, profile_id.encode()))
    return _field(1, series)


def _ingest_value(text: str) -> str:
    # The ingest API's name is SERVICE{k=v,...}: these characters would end a value early.
    return "".join("_" if c in "{},=\"'" else c for c in text)


def ingest_query(labels: dict[str, str], start_ns: int, end_ns: int) -> str:
    """The query string of ``/ingest``: ``name`` (service and labels), the time span in
    seconds, and ``format=pprof``."""
    rest = ",".join(
        f"{k}={_ingest_value(v)}"
        for k, v in sorted(labels.items())
        if k not in ("__name__", "service_name")
    )
    name = f"{labels['service_name']}{{{rest}}}"
    start = start_ns // 1_000_000_000
    end = max(start, -(-end_ns // 1_000_000_000))
    return (
        f"name={quote(name, safe='')}&from={start}&until={end}&format=pprof"
        f"&spyName=alloctrace&units=bytes&aggregationType=sum"
    )


class PushError(Exception):
    """One request that failed; *retry* says whether the profile should be sent again."""

    def __init__(self, reason: str, retry: bool, status: int | None = None):
        super().__init__(reason)
        self.retry = retry
        self.status = status


class _Resolver:
    """``getaddrinfo`` bounded by the push timeout, which the resolver itself does not know:
    a name server that does not answer held each attempt (and a first exit push) for the
    resolver's own delays, 5 s a try by default, several tries.

    The lookup runs on a daemon thread and is waited for up to the timeout; one that outlives
    it is left to finish and picked up by the next attempt, so that a dead name server costs
    one thread, never one per attempt."""

    def __init__(self):
        # (host, port) -> (thread, result box) of the lookup under way.
        self._pending: dict = {}

    def resolve(self, host: str, port: int, timeout: float) -> list:
        import socket
        import threading

        try:
            import ipaddress

            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            # An address: nothing to look up, no thread needed.
            return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        key = (host, port)
        entry = self._pending.get(key)
        if entry is not None and not entry[0].is_alive() and not entry[1]:
            entry = None  # its thread did not survive a fork(): look again
        if entry is None:
            box: dict = {}

            def lookup():
                try:
                    box["found"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                except OSError as exc:
                    box["error"] = exc

            thread = threading.Thread(target=lookup, name="alloctrace-push-resolve", daemon=True)
            try:
                _threads.start(thread)
            except RuntimeError:
                # No new thread once the interpreter shuts down (3.12+), as for the exit
                # push: the lookup runs here, bounded by the resolver's own delays only.
                lookup()
            else:
                entry = self._pending[key] = (thread, box)
        if entry is not None:
            thread, box = entry
            thread.join(timeout)
            if thread.is_alive():
                raise PushError(f"cannot resolve {host} within {timeout:g} s", retry=True)
            del self._pending[key]
        if "error" in box:
            raise PushError(f"cannot resolve {host}", retry=True)
        return box["found"]


def _connecting_to(addresses: list):
    """``socket.create_connection`` for http.client, to the addresses already resolved: the
    connection keeps the host's name for its ``Host`` header and TLS's server name."""
    import socket

    def create_connection(address, timeout, source_address=None):
        error: OSError = OSError(f"no address for {address[0]}")
        for family, kind, proto, _, sockaddr in addresses:
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(timeout)
                if source_address:
                    sock.bind(source_address)
                sock.connect(sockaddr)
                return sock
            except OSError as exc:
                error = exc
                sock.close()
        raise error

    return create_connection


class Sender:
    """Sends profiles to one target, choosing the API on the first answer."""

    def __init__(self, target: Target, timeout: float):
        self.target = target
        self.timeout = timeout
        #: "connect" until the server shows it does not speak it; then "ingest".
        self.api = "connect"
        self._resolver = _Resolver()

    def _post(self, path: str, body: bytes, headers: dict[str, str], timeout: float):
        import http.client
        import socket

        cls = (
            http.client.HTTPSConnection
            if self.target.scheme == "https"
            else http.client.HTTPConnection
        )
        began = time.monotonic()
        addresses = self._resolver.resolve(self.target.host, self.target.port, timeout)
        # The request's own timeout is what the lookup left of it (at least a tenth).
        timeout = max(timeout - (time.monotonic() - began), timeout / 10)
        connection = cls(self.target.host, self.target.port, timeout=timeout)
        connection._create_connection = _connecting_to(addresses)
        try:
            connection.request("POST", path, body=body, headers=headers)
            response = connection.getresponse()
            # An answer is read whole, up to a bound, so that a server sending forever cannot
            # hold the thread or its memory.
            data = response.read(64 * 1024)
            return response.status, response.getheader("Content-Type", ""), data
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if isinstance(exc, socket.timeout) or "timed out" in str(exc):
                reason = f"no answer within {timeout:g} s"
            elif isinstance(exc, socket.gaierror):
                reason = f"cannot resolve {self.target.host}"
            elif isinstance(exc, http.client.HTTPException):
                reason = f"bad answer ({type(exc).__name__})"
            else:
                reason = (
                    exc.strerror or type(exc).__name__ if isinstance(exc, OSError) else str(exc)
                )
            raise PushError(reason, retry=True) from None
        finally:
            connection.close()

    def send(
        self,
        labels: dict[str, str],
        raw: bytes,
        gzipped: bytes,
        start_ns: int,
        end_ns: int,
        timeout: float | None = None,
    ) -> str:
        """Send one profile (*raw*: the pprof message; *gzipped*: the same, gzipped); return
        the API that took it. Raises :exc:`PushError`."""
        import gzip
        import uuid

        timeout = self.timeout if timeout is None else timeout
        if self.api == "connect":
            body = gzip.compress(push_request(labels, raw, str(uuid.uuid4())), 6)
            headers = self.target.headers()
            headers["Content-Type"] = "application/proto"
            headers["Content-Encoding"] = "gzip"
            status, ctype, answer = self._post(
                self.target.base + CONNECT_PATH, body, headers, timeout
            )
            if 200 <= status < 300 and ctype.split(";")[0].strip() == "application/proto":
                return "connect"
            if not (status in (404, 405, 415) or 200 <= status < 300):
                raise _answer_error(status, answer)
            # The server does not speak Connect: try the ingest API, and keep it if it works.
        headers = self.target.headers()
        headers["Content-Type"] = "application/octet-stream"
        path = f"{self.target.base}{INGEST_PATH}?{ingest_query(labels, start_ns, end_ns)}"
        status, _, answer = self._post(path, gzipped, headers, timeout)
        if 200 <= status < 300:
            self.api = "ingest"
            return "ingest"
        if self.api == "connect":
            raise PushError(
                f"the server answered neither the Connect push API nor /ingest "
                f"(HTTP {status} from /ingest)",
                retry=False,
                status=status,
            )
        raise _answer_error(status, answer)


def _answer_error(status: int, answer: bytes) -> PushError:
    text = answer[:160].decode("utf-8", "replace")
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    detail = f": {text}" if text else ""
    retry = status == 429 or status >= 500 or status == 408
    return PushError(f"HTTP {status}{detail}", retry=retry, status=status)


# --- the pusher --------------------------------------------------------------------------


def _base_labels(service: str, tags: dict[str, str]) -> dict[str, str]:
    import platform
    import socket

    labels = dict(tags)
    labels.update(
        {
            "__name__": "memory",
            "service_name": service,
            "host": socket.gethostname(),
            "pid": str(os.getpid()),
            "process.runtime.name": sys.implementation.name,
            "process.runtime.version": platform.python_version(),
            "alloctrace_version": _VERSION,
        }
    )
    return labels


def _profile_of_now(start_ns: int):
    """Take the snapshots (with the GIL) and build their profile (without it): ``(raw,
    gzipped, start_ns, end_ns, gil_seconds)``, or ``None`` when not tracing.

    Two snapshots: what is alive now (``inuse_*``) and what was allocated since the last
    profile (``alloc_*``; taking it starts the next interval's counts from zero)."""
    import alloctrace
    from alloctrace._snapshot import Filter, Snapshot

    began = time.perf_counter()
    try:
        snapshot = alloctrace.take_snapshot()
        allocated = Snapshot._from_data(_native._take_allocated_snapshot())
    except RuntimeError:
        return None
    held = time.perf_counter() - began
    end_ns = time.time_ns()
    # The pusher's own allocations (requests being built) are not the program's.
    own = [Filter(False, __file__, all_frames=True)]
    data = snapshot.filter_traces(own)._data
    allocated_data = allocated.filter_traces(own)._data
    duration = max(0, end_ns - start_ns)
    raw = data.pprof_span(start_ns, duration, False, allocated_data)
    gzipped = data.pprof_span(start_ns, duration, True, allocated_data)
    return raw, gzipped, start_ns, end_ns, held


class _Pending:
    __slots__ = ("raw", "gzipped", "start_ns", "end_ns")

    def __init__(self, raw: bytes, gzipped: bytes, start_ns: int, end_ns: int):
        self.raw = raw
        self.gzipped = gzipped
        self.start_ns = start_ns
        self.end_ns = end_ns


class Pusher:
    """One process's pusher: a daemon thread, its queue, and its counters."""

    def __init__(self, target: Target, interval: float, timeout: float, service: str | None, tags):
        self.target = target
        self.interval = interval
        self.timeout = timeout
        self.service = service
        self.tags = dict(tags)
        self._reset()

    @property
    def labels(self) -> dict[str, str]:
        if self._labels is None:
            service = self.service or default_service_name()
            self._labels = _base_labels(service, self.tags)
        return self._labels

    def _reset(self) -> None:
        import collections
        import threading

        self._threading = threading
        self.sender = Sender(self.target, self.timeout)
        self._labels: dict[str, str] | None = None
        self._lock = threading.Lock()
        # Taking a profile is one at a time, so that the intervals never overlap.
        self._take_lock = threading.Lock()
        self._sending: _Pending | None = None
        self._stop = threading.Event()
        self._queue: collections.deque[_Pending] = collections.deque()
        self._thread = None
        self._closed = False
        self._warned = False
        self._last_failed = False
        self._since_ns = time.time_ns()
        self.pushed = 0
        self.failed = 0
        self.dropped = 0
        self.last_error: str | None = None
        self.snapshot_seconds_last = 0.0
        self.snapshot_seconds_max = 0.0
        self.thread_cpu_seconds = 0.0

    def status(self) -> dict:
        with self._lock:
            return {
                "url": self.target.shown,
                "api": self.sender.api,
                "interval": self.interval,
                "pushed": self.pushed,
                "failed": self.failed,
                "dropped": self.dropped,
                "queued": len(self._queue),
                "last_error": self.last_error,
                "snapshot_seconds_last": self.snapshot_seconds_last,
                "snapshot_seconds_max": self.snapshot_seconds_max,
                "thread_cpu_seconds": self.thread_cpu_seconds,
            }

    def start(self) -> None:
        # Each profile's alloc_* figures are what was allocated since the previous one (the
        # first: since now). Counting costs the hooks nothing until it is switched on.
        _native._set_counting_allocations(False)
        _native._set_counting_allocations(True)
        thread = self._threading.Thread(target=self._run, name="alloctrace-push", daemon=True)
        self._thread = thread
        _threads.start(thread)

    def _take(self, final: bool = False) -> None:
        with self._take_lock:
            if self._closed and not final:
                return
            profile = _profile_of_now(self._since_ns)
            if profile is None:
                return
            raw, gzipped, start_ns, end_ns, held = profile
            self._since_ns = end_ns
        with self._lock:
            self.snapshot_seconds_last = held
            self.snapshot_seconds_max = max(self.snapshot_seconds_max, held)
            if len(self._queue) >= QUEUE_MAX:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(_Pending(raw, gzipped, start_ns, end_ns))

    def _send_queued(self, timeout: float | None = None, final: bool = False) -> bool:
        """Send the queued profiles, oldest first; False after a failure to retry later.
        The *final* sending (at exit) leaves out the one the thread has in flight."""
        while True:
            with self._lock:
                if not self._queue:
                    return True
                item = self._queue[0]
                if final and item is self._sending:
                    self._queue.popleft()
                    continue
                if not final:
                    self._sending = item
            try:
                self.sender.send(
                    self.labels, item.raw, item.gzipped, item.start_ns, item.end_ns, timeout
                )
            except PushError as exc:
                self._failed(exc)
                if exc.retry:
                    return False
                with self._lock:
                    if self._queue and self._queue[0] is item:
                        self._queue.popleft()
                continue
            with self._lock:
                self.pushed += 1
                self._last_failed = False
                if self._queue and self._queue[0] is item:
                    self._queue.popleft()

    def _failed(self, exc: PushError) -> None:
        with self._lock:
            self.failed += 1
            self._last_failed = True
            self.last_error = str(exc)
            first = not self._warned
            self._warned = True
        if first:
            from alloctrace._startup import _warn

            _warn(
                f"cannot push memory profiles to {self.target.shown}: {exc}; the program "
                "runs on, alloctrace retries quietly (see alloctrace.get_push_status())"
            )

    def _run(self) -> None:
        next_take = time.monotonic() + self.interval
        retry_at = None
        backoff = BACKOFF_FIRST
        while not self._stop.is_set():
            now = time.monotonic()
            wake = next_take if retry_at is None else min(next_take, retry_at)
            if self._stop.wait(max(0.0, wake - now)):
                break
            now = time.monotonic()
            cpu = time.thread_time()
            try:
                if now >= next_take:
                    self._take()
                    next_take = max(next_take + self.interval, now + MIN_INTERVAL)
                    if retry_at is None:
                        retry_at = now
                if retry_at is not None and time.monotonic() >= retry_at:
                    if self._stop.is_set():
                        break
                    if self._send_queued():
                        retry_at = None
                        backoff = BACKOFF_FIRST
                    else:
                        retry_at = time.monotonic() + backoff
                        backoff = min(backoff * 2, BACKOFF_MAX)
            except Exception as exc:  # the program must never see the pusher's troubles
                self._failed(PushError(f"{type(exc).__name__}: {exc}", retry=True))
                retry_at = time.monotonic() + backoff
            finally:
                self.thread_cpu_seconds += time.thread_time() - cpu

    def close(self, final: bool = True) -> None:
        """Stop the thread; with *final*, take a last profile and make one attempt to send
        what is queued, bounded by the timeout (skipped if the last attempt failed)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not self._threading.current_thread():
            # A thread in the middle of a request finishes it within the timeout; exit does not
            # wait that long.
            thread.join(0.05)
        if not final:
            _native._set_counting_allocations(False)
            return
        try:
            # The last profile carries what was allocated since the previous one.
            self._take(final=True)
            if not self._last_failed:
                self._send_queued(self.timeout, final=True)
        except Exception as exc:
            self._failed(PushError(f"{type(exc).__name__}: {exc}", retry=False))
        finally:
            _native._set_counting_allocations(False)

    def after_fork_in_child(self) -> None:
        """The child is its own process: its own pid label, queue, warning and thread."""
        closed = self._closed
        self._reset()
        if closed:
            self._closed = True
            _native._set_counting_allocations(False)
            return
        self.start()
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:
            # multiprocessing's fork children leave through os._exit, skipping atexit.
            mp_util.register_after_fork(self, Pusher._register_multiprocessing_exit)

    def _register_multiprocessing_exit(self) -> None:
        mp_util = sys.modules["multiprocessing.util"]
        mp_util.Finalize(None, self.close, exitpriority=-1000)


_pusher: Pusher | None = None
_fork_hook_installed = False


def _after_fork_in_child() -> None:
    if _pusher is not None:
        _pusher.after_fork_in_child()


def _at_exit() -> None:
    if _pusher is not None:
        _pusher.close()


def settings(
    url: str,
    *,
    interval: float | None = None,
    timeout: float | None = None,
    service: str | None = None,
    tags: dict[str, str] | None = None,
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
    tenant: str | None = None,
    environ=None,
) -> dict:
    """Check every push setting; arguments left ``None`` come from the variables."""
    env = os.environ if environ is None else environ
    if interval is None:
        interval = env.get(ENV_PUSH_INTERVAL) or DEFAULT_INTERVAL
        interval = _seconds(interval, ENV_PUSH_INTERVAL, MIN_INTERVAL)
    else:
        interval = _seconds(interval, "interval", MIN_INTERVAL)
    if timeout is None:
        timeout = env.get(ENV_PUSH_TIMEOUT) or DEFAULT_TIMEOUT
        timeout = _seconds(timeout, ENV_PUSH_TIMEOUT, 0.1)
    else:
        timeout = _seconds(timeout, "timeout", 0.1)
    if service is None:
        service = env.get(ENV_SERVICE) or None
    if service is not None and not _service_name_ok(service):
        raise PushConfigError(
            f"service name {service[:100]!r} is invalid: letters, digits, '_', '.', '-', '/'"
        )
    if tags is None:
        tags = parse_tags(env.get(ENV_TAGS, ""))
    else:
        tags = parse_tags(",".join(f"{k}={v}" for k, v in dict(tags).items()), "tags")
    target = Target(
        url,
        user=user if user is not None else env.get(ENV_PUSH_USER) or None,
        password=password if password is not None else env.get(ENV_PUSH_PASSWORD) or None,
        token=token if token is not None else env.get(ENV_PUSH_TOKEN) or None,
        tenant=tenant if tenant is not None else env.get(ENV_PUSH_TENANT) or None,
    )
    return {
        "target": target,
        "interval": interval,
        "timeout": timeout,
        "service": service,
        "tags": tags,
    }


def start_push(url: str, **options) -> None:
    """Push a memory profile of this process every *interval* seconds to the
    Pyroscope-compatible server at *url*; see :func:`alloctrace.start_push`."""
    global _pusher, _fork_hook_installed
    config = settings(url, **options)
    if _pusher is not None and not _pusher._closed:
        raise RuntimeError("already pushing: call stop_push() first")
    pusher = Pusher(
        config["target"], config["interval"], config["timeout"], config["service"], config["tags"]
    )
    if not _fork_hook_installed:
        import atexit

        atexit.register(_at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_hook_installed = True
    _pusher = pusher
    pusher.start()


def stop_push(final: bool = True) -> None:
    """Stop pushing; with *final*, push a last profile first (bounded by the timeout)."""
    global _pusher
    pusher = _pusher
    if pusher is not None:
        pusher.close(final)


def get_push_status() -> dict | None:
    """The pusher's counters, or ``None`` if this process never pushed."""
    return None if _pusher is None else _pusher.status()


def push_snapshot(snapshot, sender: Sender, labels: dict[str, str]) -> str:
    """Send one snapshot (loaded from a file) as a profile stamped with its own time.

    A snapshot file records what was alive, not what was allocated: its profile has the
    ``inuse_*`` sample types only."""
    stamp = snapshot.metadata.get("timestamp") or time.time()
    end_ns = int(stamp * 1e9)
    data = snapshot._data
    raw = data.pprof_span(end_ns, 0, False)
    gzipped = data.pprof_span(end_ns, 0, True)
    return sender.send(labels, raw, gzipped, end_ns, end_ns)
