"""Decoding of what a profile pusher sends, for the push tests: the protobuf wire format read
generically, then the Pyroscope push request (``push.v1.PushRequest``) and the pprof profile
(``perftools.profiles.Profile``) read field by field from their published schemas."""

from __future__ import annotations

import gzip


def fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """Every (field number, value) of a protobuf message: ints for varints and fixed-width
    fields, bytes for length-delimited ones. Raises ValueError on a malformed message."""
    out = []
    pos = 0
    end = len(data)

    def varint() -> int:
        nonlocal pos
        shift = value = 0
        while True:
            if pos >= end or shift > 63:
                raise ValueError("truncated or overlong varint")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while pos < end:
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.append((number, varint()))
        elif wire == 2:
            size = varint()
            if pos + size > end:
                raise ValueError("length-delimited field runs past the end")
            out.append((number, data[pos : pos + size]))
            pos += size
        elif wire == 1:
            out.append((number, int.from_bytes(data[pos : pos + 8], "little")))
            pos += 8
        elif wire == 5:
            out.append((number, int.from_bytes(data[pos : pos + 4], "little")))
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return out


def packed(value: int | bytes) -> list[int]:
    """A repeated integer field's values: packed (bytes) or one unpacked value."""
    if isinstance(value, int):
        return [value]
    return [v for _, v in fields(_as_varints(value))]


def _as_varints(data: bytes) -> bytes:
    # A packed run of varints read as a sequence of field-1 varints.
    out = bytearray()
    pos = 0
    while pos < len(data):
        start = pos
        while data[pos] & 0x80:
            pos += 1
        pos += 1
        out += b"\x08" + data[start:pos]
    return bytes(out)


def signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def push_request(body: bytes) -> list[dict]:
    """The series of a ``PushRequest``: ``{"labels": {name: value}, "samples": [(raw_profile,
    ID)]}`` each."""
    series = []
    for number, value in fields(body):
        assert number == 1, f"unexpected PushRequest field {number}"
        labels: dict[str, str] = {}
        samples = []
        for n, v in fields(value):
            if n == 1:
                pair = dict(fields(v))
                name = pair.get(1, b"").decode()
                assert name not in labels, f"label {name} twice"
                labels[name] = pair.get(2, b"").decode()
            elif n == 2:
                sample = dict(fields(v))
                samples.append((sample.get(1, b""), sample.get(2, b"").decode()))
        series.append({"labels": labels, "samples": samples})
    return series


def profile(raw: bytes) -> dict:
    """A pprof profile (gzipped or not) as a dict of its decoded parts, values resolved
    through the string table."""
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    parts = fields(raw)
    strings = [v.decode() for n, v in parts if n == 6]
    assert strings and strings[0] == "", "string_table[0] must be empty"

    def s(i: int) -> str:
        return strings[i]

    def value_type(b: bytes) -> tuple[str, str]:
        f = dict(fields(b))
        return s(f.get(1, 0)), s(f.get(2, 0))

    functions = {}
    for n, v in parts:
        if n == 5:
            f = dict(fields(v))
            functions[f[1]] = {"name": s(f.get(2, 0)), "filename": s(f.get(4, 0))}
    locations = {}
    for n, v in parts:
        if n == 4:
            f = fields(v)
            lid = dict(f)[1]
            lines = []
            for ln, lv in f:
                if ln == 4:
                    line = dict(fields(lv))
                    lines.append((functions[line[1]], line.get(2, 0)))
            locations[lid] = lines
    samples = []
    for n, v in parts:
        if n == 2:
            loc: list[int] = []
            values: list[int] = []
            labels = {}
            for sn, sv in fields(v):
                if sn == 1:
                    loc += packed(sv)
                elif sn == 2:
                    values += [signed(x) for x in packed(sv)]
                elif sn == 3:
                    lab = dict(fields(sv))
                    labels[s(lab[1])] = s(lab[2]) if 2 in lab else lab.get(3, 0)
            samples.append(
                {"stack": [locations[i] for i in loc], "values": values, "labels": labels}
            )
    single = {n: v for n, v in parts if n in (9, 10, 11, 12, 14)}
    return {
        "sample_type": [value_type(v) for n, v in parts if n == 1],
        "samples": samples,
        "time_nanos": signed(single.get(9, 0)),
        "duration_nanos": signed(single.get(10, 0)),
        "period_type": value_type(single[11]) if 11 in single else None,
        "period": signed(single.get(12, 0)),
        "comments": [s(i) for n, v in parts if n == 13 for i in packed(v)],
        "default_sample_type": s(single.get(14, 0)),
        "strings": strings,
    }


# --- a loopback Pyroscope stand-in -------------------------------------------------------

CONNECT = "/push.v1.PusherService/Push"


class Receiver:
    """An HTTP server on 127.0.0.1 that answers as Pyroscope documents it, or misbehaves.

    *mode*: ``"connect"`` (the Connect push API; ``/ingest`` is 404), ``"ingest"`` (only the
    older ``/ingest``; the Connect path is 404, as on servers that predate it), ``"500"``
    (every request fails), ``"stall"`` (no answer for *stall* seconds), ``"garbage"``
    (bytes that are not HTTP), ``"close"`` (the connection is closed mid-request).
    Every request that arrived whole is kept in :attr:`requests` as ``(path, headers,
    body)`` with headers lower-cased."""

    def __init__(self, mode: str = "connect", stall: float = 10.0):
        import http.server
        import threading

        self.mode = mode
        self.requests: list[tuple[str, dict, bytes]] = []
        self.attempts = 0
        self._quit = threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                receiver.attempts += 1
                length = int(self.headers.get("Content-Length", 0))
                if receiver.mode == "close":
                    self.rfile.read(min(length, 10))
                    self.connection.shutdown(2)
                    self.close_connection = True
                    return
                body = self.rfile.read(length)
                path = self.path
                receiver.requests.append(
                    (path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                if receiver.mode == "stall":
                    receiver._quit.wait(stall)
                    self.close_connection = True
                    return
                if receiver.mode == "garbage":
                    self.wfile.write(b"\x00\xff\x13 this is not HTTP\r\n\r\n")
                    self.close_connection = True
                    return
                if receiver.mode == "500":
                    self._answer(500, "application/json", b'{"code":"internal","message":"boom"}')
                    return
                base = path.split("?", 1)[0]
                if base == CONNECT and receiver.mode == "connect":
                    self._answer(200, "application/proto", b"")
                elif base == "/ingest" and receiver.mode == "ingest":
                    self._answer(200, "text/plain", b"")
                else:
                    self._answer(404, "text/plain", b"404 page not found\n")

            def _answer(self, status, ctype, body):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._quit.set()
        self.server.shutdown()
        self.server.server_close()

    def pushes(self) -> list[dict]:
        """The Connect requests, decoded: ``{"labels", "profile", "id", "headers"}`` each."""
        out = []
        for path, headers, body in self.requests:
            if path != CONNECT:
                continue
            if headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            for series in push_request(body):
                for raw, profile_id in series["samples"]:
                    out.append(
                        {
                            "labels": series["labels"],
                            "profile": profile(raw),
                            "raw": raw,
                            "id": profile_id,
                            "headers": headers,
                        }
                    )
        return out
