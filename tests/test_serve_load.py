"""`gpuanat serve` under load (issue #53, item 4): many tabs at once, tabs that vanish mid-run, a tab that stops
reading, and the token in no log — against one real `gpuanat serve --debug` (every logger at debug level, its output
kept in files) with aiohttp's websocket client speaking textual-serve's protocol as the page does
(`tests/serve_clients.py`). The checks share the server, in order, as a user's tabs would; the last one stops it and
reads everything it wrote. Heavier loads (20 tabs, 50 tabs closed mid-run): `benchmarks/serve_load.py`."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from conftest import cli_env, max_step
from serve_clients import StalledTab, Tab, open_connections, start_server, stop, tree, tree_rss_bytes

TINY_CPU_RUN = ("--preset", "tiny", "--device", "cpu", "--seq-len", "32", "--samples", "400000", "--batch-size", "4")


@dataclass
class Served:
    process: object
    url: str
    token: str
    port: int
    history: Path
    stdout_path: Path
    stderr_path: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("serve_load")
    history = folder / "history.sqlite"
    process, url = start_server(cli_env(history), "--", *TINY_CPU_RUN, extra=("--debug",), logs=folder)
    token = url.split("token=", 1)[1]
    port = int(url.split(":")[2].split("/")[0])
    yield Served(process, url, token, port, history, folder / "stdout.log", folder / "stderr.log")
    stop(process)


async def wait_for(condition, what: str, timeout_s: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


async def repainted(tabs: list[Tab], rows: int, columns: int) -> list[tuple[int, int]]:
    """Press ctrl+l in the first tab (the dashboard's "redraw every cell") and wait until every tab has been drawn down
    to row `rows`; the farthest cell each tab was then drawn at. Textual now and then keeps a size it was given
    without giving it to its screen; the server sees the dashboard draw beyond the size it gave and gives it again,
    the tabs cleared and drawn whole — so a repaint drawn beyond the size is pressed for again, twice at most."""
    for attempt in range(3):
        await asyncio.sleep(0.5)  # a size just given has reached the dashboard
        marks = [len(tab.drawn) for tab in tabs]
        await tabs[0].press("\x0c")
        for tab, mark in zip(tabs, marks, strict=True):
            await wait_for(lambda tab=tab, mark=mark: tab.farthest_cell(mark)[0] >= rows, f"not drawn to row {rows}")
        await asyncio.sleep(0.5)
        farthest = [tab.farthest_cell(mark) for tab, mark in zip(tabs, marks, strict=True)]
        if all(cell <= (rows, columns) and cell[1] <= columns for cell in farthest) or attempt == 2:
            return farthest
        assert any(b"\x1b[2J" in tab.drawn[mark:] for tab, mark in zip(tabs, marks, strict=True)), (
            "drawn beyond, never healed"
        )
    raise AssertionError("unreachable")


@pytest.mark.asyncio
async def test_six_tabs_each_draw_the_whole_dashboard_and_one_tab_never_breaks_another(served):
    """Six tabs of three sizes: each is drawn the whole dashboard, at the smallest tab's size so it fits in every one;
    a key typed in one tab is drawn, the same frames, in all; the smallest tabs close and the rest are cleared and
    drawn at the next size; a tab that shrinks to a sliver does not shrink the others below 40x12."""
    sizes = [(120, 40), (100, 30), (120, 40), (90, 28), (120, 40), (100, 30)]
    tabs = [await Tab(served.url, width, height).open() for width, height in sizes]
    try:
        for tab in tabs:
            await tab.wait_for_text("gpuanat", "batch size")
            assert tab.pongs == 1 and not tab.closed
        for rows, columns in await repainted(tabs, 28, 90):
            assert rows == 28 and columns <= 90, (rows, columns)

        marks = [len(tab.drawn) for tab in tabs]
        await tabs[3].press("?")  # the key page, typed in one tab
        for tab, mark in zip(tabs, marks, strict=True):
            await tab.wait_for_text("Expandable segments", since=mark)
        await asyncio.sleep(0.5)
        shown = [tab.frames_from(b"Expandable segments") for tab in tabs]
        assert len({tuple(frames[: min(map(len, shown))]) for frames in shown}) == 1  # the same frames in every tab
        await tabs[0].press("?")

        for small in (tabs[3], tabs[1], tabs[5]):  # the 90x28 and 100x30 tabs close: 120x40 is everyone's size
            await small.close()
        large = [tabs[0], tabs[2], tabs[4]]
        marks = [len(tab.drawn) for tab in large]
        for tab, mark in zip(large, marks, strict=True):
            await wait_for(lambda tab=tab, mark=mark: tab.farthest_cell(mark)[0] == 40, "not drawn at 120x40")
            assert b"\x1b[2J" in tab.drawn[mark:]  # cleared before the larger dashboard was drawn
            await tab.wait_for_text("gpuanat", "batch size", since=mark)

        await large[1].resize(12, 4)  # a window dragged almost shut
        for rows, columns in await repainted(large, 12, 40):
            assert rows == 12 and columns <= 40, (rows, columns)
        await large[1].resize(120, 40)
        for rows, columns in await repainted(large, 40, 120):
            assert rows == 40 and columns <= 120, (rows, columns)
    finally:
        for tab in tabs:
            if not tab.closed:
                await tab.close()


async def redraw_storm(tab: Tab) -> None:
    """ctrl+l ten times a second in `tab`: a whole screen each time, for every tab."""
    while True:
        await tab.press("\x0c")
        await asyncio.sleep(0.1)


async def still_drawn_training(tab: Tab, history: Path) -> None:
    """The run records new steps and `tab` is drawn its progress line (`step N/100000`) anew."""
    mark, steps = len(tab.drawn), max_step(history)
    await wait_for(lambda: max_step(history) > steps and "/100000" in tab.text(mark), "the run's progress not drawn")


@pytest.mark.asyncio
async def test_tabs_that_vanish_mid_run_and_a_tab_that_stops_reading_leave_the_run_and_the_other_tabs_going(served):
    """A run starts from one tab, which then presses ctrl+l ten times a second (a whole screen each, for every tab). A
    tab that stops reading its socket, and twelve tabs that vanish without a closing handshake (their connections
    dropped), come and go while it trains: the watching tab keeps being drawn the run's progress, the run trains on,
    no process is added or lost, the server's memory stays within bounds, and the server holds no connection of any
    of them within 40 s (a vanished one at once; the stalled one, its unsent screens still queued, by aiohttp's 15 s
    heartbeat or the 20 s cut, whichever comes first)."""
    watching = await Tab(served.url).open()
    stalled, storm = None, None
    try:
        await watching.wait_for_text("batch size")
        connections_before = open_connections(served.process.pid, served.port)
        await watching.press("r")
        stalled = StalledTab(served.url).open()  # from now on it reads nothing
        storm = asyncio.create_task(redraw_storm(watching))  # far more output than the kernel's buffers hold
        await watching.wait_for_text("run 1: step", timeout_s=120)
        processes_before = {process.pid for process in tree(served.process.pid)}
        rss_before = tree_rss_bytes(served.process.pid)
        steps_before = max_step(served.history)
        for _ in range(12):  # each one opens, is drawn a whole screen, and its connection is dropped
            tab = await Tab(served.url).open()
            await tab.wait_for_text("run 1: step")
            await tab.vanish()
        await still_drawn_training(watching, served.history)
        assert {process.pid for process in tree(served.process.pid)} == processes_before
        await wait_for(  # the vanished tabs' connections, and the stalled one's once it took nothing for 20 s
            lambda: open_connections(served.process.pid, served.port) == connections_before,
            "the server still holds a connection of a tab that vanished or stopped reading",
            timeout_s=40,
        )
        storm.cancel()
        assert max_step(served.history) > steps_before  # the run trained on throughout
        rss_growth = tree_rss_bytes(served.process.pid) - rss_before
        assert rss_growth < 64 << 20, rss_growth
        assert {process.pid for process in tree(served.process.pid)} == processes_before
        await still_drawn_training(watching, served.history)
        assert not watching.closed
    finally:
        if storm is not None:
            storm.cancel()
        await watching.close()
        if stalled is not None:
            stalled.close()


def request_status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as refused:
        return refused.code


def raw_request(port: int, request: bytes) -> bytes:
    """`request` sent as it is (a malformed one aiohttp's parser refuses); the server's answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


@pytest.mark.asyncio
async def test_the_token_is_in_no_log_at_debug_level(served):
    """Last, on the same server (every logger at debug level, after the loads above): right, wrong and absent tokens
    in the URL, the cookie, the referrer, the user agent, %-escaped, in the terminal's websocket URL, and in requests
    aiohttp's parser refuses; then the server stopped. The token is written once, in the line that gives the URL to
    open, and nowhere else: not in stdout or stderr (their lines joined, as the log wraps them), not in any file the
    server and its dashboard wrote, not %-escaped."""
    bare, token, port = served.url.split("?")[0], served.token, served.port
    cookie = {"Cookie": f"gpuanat_serve_{port}={token}"}
    escaped = "".join(f"%{byte:02X}" for byte in token.encode())
    statuses = [
        request_status(bare),
        request_status(bare + "?token=" + token[:-3] + "abc"),
        request_status(served.url, {"Referer": served.url, "User-Agent": f"agent {token}"}),
        request_status(bare + "static/js/textual.js", {"Referer": served.url}),
        request_status(bare + "?token=" + escaped),
        request_status(bare + "?%74oken=" + escaped + "&x=1"),
        request_status(bare, cookie),
        request_status(bare, {"Cookie": f"gpuanat_serve_{port}={token[:-1]}"}),
        request_status(bare + "ws?width=80&height=24&token=" + token[:-2] + "zz"),
    ]
    assert statuses == [403, 403, 200, 200, 200, 200, 200, 403, 403], statuses
    tab = await Tab(served.url).open()
    await tab.socket.close()  # the page's connection, with the cookie
    terminal_url = bare.replace("http", "ws", 1) + f"ws?width=80&height=24&token={token}"  # the token in its URL
    async with aiohttp.ClientSession() as session, session.ws_connect(terminal_url) as terminal:
        await terminal.send_str("not json " + token)  # a message the server cannot read: ignored, not logged
    await tab.session.close()
    for malformed in (
        f"GET /?token={token} HTTP/1.1\r\nHost: x\r\nBad\x01Header: {token}\r\n\r\n".encode(),
        f"GET /?token={token}\x7f HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        f"GET /?token={token} HTTP/9.9\r\n\r\n".encode(),
    ):
        assert raw_request(port, malformed).split(b"\r\n")[0].endswith(b" 400 Bad Request"), malformed
    stop(served.process)
    assert served.process.returncode == 0  # it stopped on SIGTERM, its dashboard quit (not killed after 30 s)

    first_line, *rest = served.stdout_path.read_text().splitlines()
    assert first_line.count(token) == 1  # the URL to open, given once
    logged = {
        path: path.read_bytes().decode(errors="replace")
        for path in served.stdout_path.parent.rglob("*")
        if path.is_file()
    }
    logged[served.stdout_path] = "\n".join(rest)
    assert "token=…" in logged[served.stdout_path] and "Bad" in logged[served.stdout_path]  # the requests were logged
    for path, text in logged.items():
        joined = "".join(text.split())  # the log's lines are wrapped: a token cut in two is found too
        for form in (token, escaped, escaped.lower()):
            assert form not in joined, (path, text[-3000:])
