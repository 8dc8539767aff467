"""Open a page in headless Chromium as a reader would, through the DevTools protocol over a pipe.

Chromium's ``--remote-debugging-pipe`` reads commands on its file descriptor 3 and writes replies
and events on 4, each a JSON object ended by a NUL byte: no WebSocket client, no driver package.
:func:`open_page` loads a page, waits for its load event, and returns what a test checks: every
console message and uncaught exception, every request the page made (a self-contained page makes
none but ``data:``), every image with its size once decoded, the headings, and a full-page
screenshot (PNG bytes).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

#: The Debian package's command, and the names other systems give it.
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
#: A guard against a hang only (a browser that never answers): minutes, never a test's pass condition.
GUARD_S = 600.0
IMAGES_JS = ("JSON.stringify(Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete, "
             "width: i.naturalWidth, height: i.naturalHeight})))")
HEADINGS_JS = "JSON.stringify(Array.from(document.querySelectorAll('h1, h2')).map(h => h.textContent))"
HEIGHT_JS = "Math.ceil(document.documentElement.scrollHeight)"
#: the browser's file descriptors 3 and 4 from the two given (copied first: either may be 3 or 4), then the browser
TRAMPOLINE = ("import os, sys; a, b = os.dup(int(sys.argv[1])), os.dup(int(sys.argv[2])); os.dup2(a, 3); "
              "os.dup2(b, 4); os.set_inheritable(3, True); os.set_inheritable(4, True); "
              "os.execvp(sys.argv[3], sys.argv[3:])")


def find_browser() -> str | None:
    """The path of a Chromium on this machine, or None."""
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


@dataclass
class Page:
    """What a reader's browser saw of one page."""

    console: list[str] = field(default_factory=list)  # console messages of level error or warning, exceptions
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, itself included
    images: list[dict] = field(default_factory=list)
    headings: list[str] = field(default_factory=list)
    screenshot: bytes = b""


class _Pipe:
    """The DevTools protocol over Chromium's pipe: commands with ids, events collected on the way."""

    def __init__(self, browser: str, profile: str) -> None:
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()
        args = [browser, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--hide-scrollbars", "--no-first-run", "--no-default-browser-check",
                f"--user-data-dir={profile}", "about:blank"]
        # the pipe's ends become the browser's 3 and 4 in a small trampoline, not in a preexec_fn (unsafe in a
        # process with threads, as a test process running the app has)
        self.process = subprocess.Popen([sys.executable, "-c", TRAMPOLINE, str(to_child), str(from_child), *args],
                                        pass_fds=(to_child, from_child), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)
        self._buffer, self._next_id, self.events = b"", 0, []

    def command(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict:
        while True:
            found = next((e for e in self.events if e.get("method") == method), None)
            if found is not None:
                return found
            self.events.append(self._read())

    def _read(self) -> dict:
        deadline = time.monotonic() + GUARD_S
        while b"\0" not in self._buffer:
            chunk = os.read(self._in, 1 << 16)
            if not chunk or time.monotonic() > deadline:
                raise RuntimeError("the browser closed its pipe" if not chunk else "the browser stopped answering")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        try:
            self.command("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.process.wait(GUARD_S)
        finally:
            if self.process.poll() is None:
                self.process.kill()
            os.close(self._in)
            os.close(self._out)


def open_page(path: Path, width: int = 1200, browser: str | None = None, height: int | None = None) -> Page:
    """Load ``path`` (a local file) in a fresh headless Chromium ``width`` pixels wide; the :class:`Page`
    (its screenshot of the whole page, or of its top ``height`` pixels)."""
    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError("no Chromium found (" + ", ".join(BROWSERS) + ")")
    with tempfile.TemporaryDirectory(prefix="fedgraph-browser-") as profile:
        pipe = _Pipe(browser, profile)
        try:
            return _visit(pipe, Path(path).resolve().as_uri(), width, height)
        finally:
            pipe.close()


def _visit(pipe: _Pipe, url: str, width: int, shown: int | None = None) -> Page:
    target = pipe.command("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = pipe.command("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        pipe.command(f"{domain}.enable", session=session)
    pipe.command("Emulation.setDeviceMetricsOverride", {"width": width, "height": 800, "deviceScaleFactor": 1,
                                                        "mobile": False}, session)
    pipe.events.clear()
    pipe.command("Page.navigate", {"url": url}, session)
    pipe.wait_for("Page.loadEventFired")

    def evaluate(expression: str):
        return pipe.command("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                            session)["result"]["value"]

    page = Page(images=json.loads(evaluate(IMAGES_JS)), headings=json.loads(evaluate(HEADINGS_JS)))
    height = shown or int(evaluate(HEIGHT_JS))
    pipe.command("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                        "mobile": False}, session)
    shot = pipe.command("Page.captureScreenshot", {"format": "png"}, session)
    page.screenshot = base64.b64decode(shot["data"])
    for event in pipe.events:
        _note(page, event)
    return page


def _note(page: Page, event: dict) -> None:
    """Keep what a test checks of one protocol event."""
    method, params = event.get("method"), event.get("params", {})
    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
        page.console.append(f"console.{params['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                                     for a in params.get("args", [])))
    elif method == "Runtime.exceptionThrown":
        page.console.append("exception: " + params["exceptionDetails"].get("text", ""))
    elif method == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
        page.console.append(f"log.{params['entry']['level']}: {params['entry'].get('text', '')}")
    elif method == "Network.requestWillBeSent":
        page.requests.append(params["request"]["url"])
