"""A headless Chromium driven over the DevTools protocol, for the HTML report's tests.

Debian's ``chromium`` is started with its own empty profile and no network chatter; the page is
driven with a few protocol commands (evaluate, mouse clicks, key presses, screenshots) over
``websocket-client``. :func:`chromium_or_skip` skips a test, saying why, where there is no
browser (tests/run.sh installs Debian's where it can).

Also a small PNG reader (8-bit RGB/RGBA, as Chromium writes them), so screenshots can be
checked pixel by pixel without an imaging library.
"""

import base64
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
import urllib.request
import zlib

import pytest

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
)


def chromium_or_skip():
    """The browser to use, or skip: names what is missing."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            break
    else:
        pytest.skip("no chromium on PATH (tests/run.sh installs Debian's where apt-get works)")
    try:
        import websocket  # noqa: F401
    except ImportError:
        pytest.skip("websocket-client is not installed (tests/requirements.txt lists it)")
    return path


class Browser:
    """One headless Chromium with one page; use as a context manager."""

    def __init__(self, executable, width=1200, height=1000):
        import websocket

        self.profile = tempfile.mkdtemp(prefix="alloctrace-chromium-")
        self.process = subprocess.Popen(
            [
                executable,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={self.profile}",
                "--remote-debugging-port=0",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            port = self._port()
            page = self._page_target(port)
            self.ws = websocket.create_connection(
                page["webSocketDebuggerUrl"], timeout=30, suppress_origin=True
            )
        except BaseException:
            self.close()
            raise
        self._next_id = 0
        self.events = []
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Network.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def _port(self):
        # With port 0, Chromium writes the port it chose to DevToolsActivePort in the profile.
        marker = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with status {self.process.returncode}")
            try:
                with open(marker) as stream:
                    first = stream.readline().strip()
                if first:
                    return int(first)
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        raise RuntimeError("chromium did not open its DevTools port within 60 s")

    @staticmethod
    def _page_target(port):
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                targets = json.load(r)
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return pages[0]
            if time.monotonic() > deadline:
                raise RuntimeError("chromium has no page target")
            time.sleep(0.1)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self):
        ws = getattr(self, "ws", None)
        if ws is not None:
            ws.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def send(self, method, **params):
        """One protocol command; returns its result and keeps the events that came before."""
        self._next_id += 1
        ident = self._next_id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_event(self, method, timeout=30):
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event["method"] == method:
                return event
        self.ws.settimeout(timeout)
        while time.monotonic() < deadline:
            message = json.loads(self.ws.recv())
            if message.get("method"):
                self.events.append(message)
                if message["method"] == method:
                    return message
        raise TimeoutError(f"no {method} within {timeout} s")

    def open(self, path):
        self.send("Page.navigate", url="file://" + os.path.abspath(path))
        self.wait_event("Page.loadEventFired")

    def errors(self):
        """Script errors so far: uncaught exceptions and console.error calls."""
        found = []
        for event in self.events:
            if event["method"] == "Runtime.exceptionThrown":
                details = event["params"]["exceptionDetails"]
                found.append(details.get("exception", {}).get("description") or details["text"])
            elif event["method"] == "Runtime.consoleAPICalled":
                if event["params"]["type"] == "error":
                    found.append(" ".join(str(a.get("value")) for a in event["params"]["args"]))
        return found

    def eval(self, expression):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def center(self, selector):
        """The centre of the first element matching *selector*, in page pixels."""
        box = self.eval(
            f"(function(){{var r=document.querySelector({json.dumps(selector)})"
            ".getBoundingClientRect();return [r.left+r.width/2,r.top+r.height/2];})()"
        )
        return box[0], box[1]

    def click(self, x, y):
        """A real mouse click (moved there first, so hover handlers run too)."""
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def hover(self, x, y):
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    def type_into(self, selector, text):
        """Focus an input and type *text* into it key by key."""
        self.eval(f"document.querySelector({json.dumps(selector)}).focus()")
        self.send("Input.insertText", text=text)

    def scroll_to(self, selector):
        self.eval(f"document.querySelector({json.dumps(selector)}).scrollIntoView()")

    def screenshot(self, selector=None):
        """A PNG of the viewport, or of one element's box (see :func:`read_png`)."""
        params = {"format": "png"}
        if selector is not None:
            rect = self.eval(
                f"(function(){{var r=document.querySelector({json.dumps(selector)})"
                ".getBoundingClientRect();"
                "return [r.left+scrollX,r.top+scrollY,r.width,r.height];})()"
            )
            x, y, width, height = rect
            params["clip"] = {"x": x, "y": y, "width": width, "height": height, "scale": 1}
        return base64.b64decode(self.send("Page.captureScreenshot", **params)["data"])


def read_png(data):
    """Decode an 8-bit, non-interlaced RGB or RGBA PNG: (width, height, rows of (r, g, b))."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos = 8
    idat = b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or color not in (2, 6) or interlace:
                raise ValueError(f"unsupported PNG: depth {depth}, colour type {color}")
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    channels = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows = []
    previous = bytearray(stride)
    pos = 0
    for _ in range(height):
        kind = raw[pos]
        line = bytearray(raw[pos + 1 : pos + 1 + stride])
        pos += 1 + stride
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                predictor = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + predictor) & 0xFF
        rows.append([tuple(line[x * channels : x * channels + 3]) for x in range(width)])
        previous = line
    return width, height, rows


def blobs(rows, color, tolerance=0):
    """Connected groups of pixels of *color*: a list of (centre x, centre y, pixel count)."""
    height = len(rows)
    width = len(rows[0]) if rows else 0

    def near(pixel):
        return all(abs(a - b) <= tolerance for a, b in zip(pixel, color))

    seen = set()
    found = []
    for y in range(height):
        for x in range(width):
            if (x, y) in seen or not near(rows[y][x]):
                continue
            stack = [(x, y)]
            seen.add((x, y))
            xs = ys = n = 0
            while stack:
                cx, cy = stack.pop()
                xs += cx
                ys += cy
                n += 1
                for nx, ny in ((cx + 1, cy), (cx - 1, cy), (cx, cy + 1), (cx, cy - 1)):
                    if 0 <= nx < width and 0 <= ny < height and (nx, ny) not in seen:
                        if near(rows[ny][nx]):
                            seen.add((nx, ny))
                            stack.append((nx, ny))
            found.append((xs / n, ys / n, n))
    return found
