"""`gpuanat serve` (issue #33): the dashboard in a real browser. Debian's Chromium, headless, driven through the
DevTools protocol (aiohttp's websocket client, which textual-serve brings): the page with the token draws the
dashboard, keys pressed in the page reach it, a tab closed mid-run leaves the run training and the URL opened again
shows it, stopping the server stops and records it; without the token the page and its connection are refused.
Skipped where no Chromium is installed (scripts/test_tools.sh installs Debian's)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import serve_clients
from conftest import REPO, cli_env

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)")
SCREENSHOT_DIR_VARIABLE = "GPUANAT_SCREENSHOT_DIR"
"""Where the browser's screenshot of the served dashboard goes (docs/screenshots to retake the README's)."""
ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-B]|\x1b[=>]")


def start_server(tmp_path: Path, *served: str) -> tuple[subprocess.Popen[str], str]:
    """`gpuanat serve` on a free port with a history in `tmp_path`; its process and the URL it printed."""
    return serve_clients.start_server(cli_env(tmp_path / "history.sqlite"), *served)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Browser:
    """Headless Chromium and one page, spoken to over the DevTools protocol. Every websocket frame the page receives
    (what textual-serve sends the terminal) is kept, decoded, in `drawn`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.drawn = bytearray()
        self.sockets_closed = 0
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future] = {}

    async def __aenter__(self) -> Browser:
        import aiohttp

        profile = self.folder / "chromium-profile"
        self.process = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",
                "--window-size=1280,820",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or len(port_file.read_text().splitlines()) < 2:
            assert time.monotonic() < deadline and self.process.poll() is None, "chromium did not start"
            await asyncio.sleep(0.1)
        port = port_file.read_text().splitlines()[0]
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json") as response:
            page = next(target for target in await response.json() if target["type"] == "page")
        self.socket = await self.session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        await self.call("Network.enable")
        await self.call("Page.enable")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._reader.cancel()
        await self.socket.close()
        await self.session.close()
        stop(self.process)

    async def _read(self) -> None:
        async for message in self.socket:
            data = json.loads(message.data)
            if "id" in data and data["id"] in self._replies:
                self._replies.pop(data["id"]).set_result(data)
            elif data.get("method") == "Network.webSocketClosed":
                self.sockets_closed += 1
            elif data.get("method") == "Network.webSocketFrameReceived":
                frame = data["params"]["response"]
                payload = frame["payloadData"]
                self.drawn += base64.b64decode(payload) if frame.get("opcode") == 2 else payload.encode()

    async def call(self, method: str, **params: object) -> dict:
        identifier = next(self._ids)
        self._replies[identifier] = asyncio.get_running_loop().create_future()
        await self.socket.send_json({"id": identifier, "method": method, "params": params})
        reply = await asyncio.wait_for(self._replies[identifier], 30)
        assert "error" not in reply, reply
        return reply["result"]

    def text(self, since: int = 0) -> str:
        return ANSI.sub(b"", bytes(self.drawn[since:])).decode(errors="replace")

    async def wait_for_text(self, *words: str, since: int = 0, timeout_s: float = 90) -> None:
        """Until every one of `words` has been drawn (after the first `since` bytes)."""
        deadline = time.monotonic() + timeout_s
        while not all(word in self.text(since) for word in words):
            assert time.monotonic() < deadline, f"never drawn: {words}; last drawn: {self.text(since)[-1500:]!r}"
            await asyncio.sleep(0.2)

    async def press(self, key: str) -> None:
        if key == "escape":  # a key without text: the browser's own key event, which the page's terminal turns into ESC
            named = {"key": "Escape", "code": "Escape", "windowsVirtualKeyCode": 27}
            await self.call("Input.dispatchKeyEvent", type="rawKeyDown", **named)
            await self.call("Input.dispatchKeyEvent", type="keyUp", **named)
            return
        await self.call("Input.dispatchKeyEvent", type="keyDown", key=key, text=key)
        await self.call("Input.dispatchKeyEvent", type="keyUp", key=key)

    async def open(self, url: str) -> None:
        await self.call("Page.navigate", url=url)

    async def click(self) -> None:
        """A click in the page: the terminal takes keys once focused."""
        for event in ("mousePressed", "mouseReleased"):
            await self.call("Input.dispatchMouseEvent", type=event, x=640, y=400, button="left", clickCount=1)

    async def press_until_drawn(self, key: str, *words: str, tries: int = 3) -> None:
        """Click, press `key` and wait for `words`, as a person does again when a first key went nowhere (the page
        still loading its terminal)."""
        since = len(self.drawn)
        for attempt in range(tries):
            await self.click()
            await self.press(key)
            try:
                await self.wait_for_text(*words, since=since, timeout_s=15)
                return
            except AssertionError:
                if attempt == tries - 1:
                    raise


def refused(url: str) -> int:
    try:
        urllib.request.urlopen(url, timeout=10)
    except urllib.error.HTTPError as error:
        return error.code
    return 200


async def drawn_in_another_tab(url: str) -> str:
    """What a second tab's terminal (a websocket given the token, as the page's would be) is drawn in 10 s."""
    import aiohttp

    bare, token = url.split("?token=")
    drawn = bytearray()
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(
            f"{bare.replace('http', 'ws', 1).rstrip('/')}/ws?width=120&height=40&token={token}"
        ) as socket,
    ):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                message = await asyncio.wait_for(socket.receive(), 1)
            except TimeoutError:
                continue
            if message.type == aiohttp.WSMsgType.BINARY:
                drawn += message.data
    return ANSI.sub(b"", bytes(drawn)).decode(errors="replace")


def history_rows(path: Path, query: str) -> list[tuple]:
    with sqlite3.connect(path) as history:
        return history.execute(query).fetchall()


def wait_until(condition, what: str, timeout_s: float = 60):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.5)
    return value


@needs_chromium
@pytest.mark.asyncio
async def test_the_served_dashboard_is_drawn_in_a_browser_and_outlives_its_tab(tmp_path):
    history = tmp_path / "history.sqlite"
    server, url = start_server(
        tmp_path,
        "--",
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--seq-len",
        "32",
        "--samples",
        "400000",
        "--batch-size",
        "4",
    )
    try:
        bare = url.split("?")[0]
        assert refused(bare) == 403 and refused(bare + "?token=wrong") == 403
        assert refused(bare.rstrip("/") + "/ws") == 403  # the terminal's connection too
        async with Browser(tmp_path) as browser:
            await browser.open(url)
            await browser.wait_for_text("gpuanat", "idle")
            await browser.press_until_drawn(
                "?", "Weights: fp32, bf16, pure bf16", "Engine — the training loop"
            )  # the key page, in the browser
            await browser.press("?")  # closes the key page
            drawn_before_run = len(browser.drawn)
            await browser.press("r")
            await browser.wait_for_text("run 1: step", since=drawn_before_run, timeout_s=120)
            await asyncio.sleep(2)
            screenshot = base64.b64decode((await browser.call("Page.captureScreenshot", format="png"))["data"])
            assert screenshot.startswith(b"\x89PNG")
            shots = Path(os.environ.get(SCREENSHOT_DIR_VARIABLE) or tmp_path)
            (shots / "serve.png").write_bytes(screenshot)  # docs/screenshots/serve.png, with the variable set

            await browser.open("about:blank")  # the tab goes mid-run: the run goes on, unseen
            steps_then = history_rows(history, "SELECT max(step) FROM steps")[0][0] or 0
            wait_until(
                lambda: (history_rows(history, "SELECT max(step) FROM steps")[0][0] or 0) > steps_then + 20,
                "the run stopped training when its tab closed",
            )
            assert history_rows(history, "SELECT status FROM runs") == [("running",)]

            drawn_before_return = len(browser.drawn)
            await browser.open(url)  # the URL again: the same dashboard, its run drawn whole in the new page
            await browser.wait_for_text("run 1: step", "weights", "Techniques", since=drawn_before_return)
            assert "idle" not in browser.text(drawn_before_return).split("run 1: step")[0][-200:]
            # and it takes keys again: one press each (the page is drawn, so no key goes nowhere; pressing again
            # when a loaded machine draws slowly would open a second key page above the first)
            for key, words in (
                ("?", ("Weights: fp32, bf16, pure bf16", "Engine — the training loop")),
                ("escape", ("run 1: step",)),
            ):
                since = len(browser.drawn)
                await browser.click()
                await browser.press(key)
                await browser.wait_for_text(*words, since=since)
            assert history_rows(history, "SELECT count(*) FROM runs") == [(1,)]

            closed_before = browser.sockets_closed  # a second tab shows the same dashboard; the first one keeps it
            drawn_before_second = len(browser.drawn)
            second_tab = await drawn_in_another_tab(url)
            assert "run 1: step" in second_tab, second_tab[-1500:]
            assert browser.sockets_closed == closed_before and "run 1: step" in browser.text(drawn_before_second)
        stop(server)  # stopping the server quits the dashboard as q does: the run stopped and recorded
        rows = wait_until(
            lambda: [
                row
                for row in history_rows(history, "SELECT status, result_json FROM runs")
                if row[0] not in ("running", None)
            ],
            "the run was never recorded",
        )
        assert rows[0][0] == "stopped" and json.loads(rows[0][1])["steps"] > steps_then + 20, rows
    finally:
        stop(server)


def test_serve_refuses_what_it_cannot_serve(tmp_path):
    for served, message in (
        (["history"], "not `history`"),
        (["watch", "1", "--json"], "--json prints records"),
        (["--", "--batch-size", "x"], "cannot serve"),
    ):
        completed = subprocess.run(
            [sys.executable, "-m", "gpuanat", "serve", *served],
            cwd=REPO,
            env=cli_env(tmp_path / "h.sqlite"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert completed.returncode == 2 and message in completed.stderr, (served, completed.stderr)


def test_serving_beyond_loopback_warns(tmp_path):
    server = subprocess.Popen(
        [sys.executable, "-m", "gpuanat", "serve", "--host", "0.0.0.0", "--port", str(serve_clients.free_port())],
        cwd=REPO,
        env=cli_env(tmp_path / "h.sqlite"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "open http://0.0.0.0:" in server.stdout.readline()
    finally:
        stop(server)
    assert "reachable from other machines" in server.stderr.read()


def test_serve_help_says_what_closing_the_tab_does(tmp_path):
    """What the browser test above shows: a closed tab leaves the run training, and it is recorded; only the server's
    stop (or `q`) ends it."""
    completed = subprocess.run(
        [sys.executable, "-m", "gpuanat", "serve", "--help"],
        cwd=REPO,
        env=cli_env(tmp_path / "h.sqlite"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    description = " ".join(completed.stdout.split())
    assert "Closing the tab leaves the dashboard and its run going" in description
    assert "the run trains on and is recorded" in description
    assert "stopping the server (ctrl+c) stops a run in progress and records it" in description
    assert "Closing a tab quits" not in description and "each tab runs its own dashboard" not in description


def test_the_access_log_never_prints_the_token(tmp_path):
    """The token is printed once, in the URL to open; the log of each request (its URL, its referrer: textual-serve's
    scripts are asked for from the page with the token) says `token=…`, a wrong token too."""
    server, url = start_server(tmp_path)
    token = url.split("token=", 1)[1]
    try:
        requests = (
            urllib.request.Request(url, headers={"Referer": url}),
            urllib.request.Request(url.rsplit("/", 1)[0] + "/static/js/textual.js", headers={"Referer": url}),
            urllib.request.Request(url.replace(token, token[:-2] + "xy")),
        )
        statuses = []
        for request in requests:
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    statuses.append(response.status)
            except urllib.error.HTTPError as refused:
                statuses.append(refused.code)
        assert statuses == [200, 200, 403]
    finally:
        stop(server)
    output = server.stdout.read() + server.stderr.read()
    assert output.count("GET /") == 3 and output.count("token=…") == 4, output
    logged = "".join(output.split())  # the log's lines are wrapped: a token cut in two must be found too
    assert token not in logged and token[:-2] not in logged, output
