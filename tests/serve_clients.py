"""Browser tabs for `gpuanat serve` without a browser: aiohttp's websocket client speaking textual-serve's protocol as
its page does (`textual_serve/static/js/textual.js`: the connection to `/ws?width=W&height=H` with the page's cookie,
then `["resize", {width, height}]` and `["ping", ms]`; keys as `["stdin", text]`, `["focus"]`/`["blur"]`; the terminal's
output comes back as binary frames), a client that stops reading its socket, and the server's process tree measured with
psutil. Used by the serve load tests and by `benchmarks/serve_load.py`."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import aiohttp
import psutil

REPO = Path(__file__).resolve().parents[1]
ANSI = re.compile(rb"\x1b\[[0-9;?<>$]*[ -/]*[@-~]|\x1b[()][0-9A-B]|\x1b[=>]")
CURSOR_TO = re.compile(rb"\x1b\[(\d+);(\d+)H")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(
    env: dict[str, str], *served: str, extra: tuple[str, ...] = (), logs: Path | None = None
) -> tuple[subprocess.Popen[str], str]:
    """`gpuanat serve` on a free port, in a session of its own; its process and the URL it printed. With `logs`, all
    it writes goes to `logs/stdout.log` (its first line too) and `logs/stderr.log`, read as it comes (a full pipe
    would stop the server)."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "gpuanat", "serve", "--port", str(port), *extra, *served],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if logs is None else (logs / "stderr.log").open("w"),
        text=True,
        start_new_session=True,
    )
    assert server.stdout is not None
    line = server.stdout.readline()
    match = re.search(r"open (http://\S+) ", line)
    assert match, line
    if logs is not None:
        stdout_log = (logs / "stdout.log").open("w")
        stdout_log.write(line)
        threading.Thread(target=_copy, args=(server.stdout, stdout_log), daemon=True).start()
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server, match.group(1)
        except OSError:
            assert time.monotonic() < deadline and server.poll() is None, "the server did not listen"
            time.sleep(0.1)


def _copy(source: IO[str], target: IO[str]) -> None:
    with target:
        for line in source:
            target.write(line)
            target.flush()


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def tree(pid: int) -> list[psutil.Process]:
    """`pid` and every process under it."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def tree_rss_bytes(pid: int) -> int:
    """The resident memory of `pid` and every process under it."""
    total = 0
    for process in tree(pid):
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def open_connections(pid: int, port: int) -> int:
    """How many connections the server `pid` holds open on its `port` (tabs, from the server's side)."""
    return sum(
        1
        for connection in psutil.Process(pid).net_connections(kind="tcp")
        if connection.laddr and connection.laddr.port == port and connection.status == psutil.CONN_ESTABLISHED
    )


class Tab:
    """One tab's terminal: a websocket opened as the page opens it, every byte of terminal output kept in `drawn`."""

    def __init__(self, url: str, width: int = 120, height: int = 40) -> None:
        self.url = url
        self.width = width
        self.height = height
        self.drawn = bytearray()
        self.frames: list[bytes] = []
        """Each binary message as it came: one frame of the dashboard's output."""
        self.pongs = 0
        self.closed = False

    @property
    def _origin(self) -> str:
        return self.url.split("/?", 1)[0]

    async def open(self) -> Tab:
        self.session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))  # cookies for 127.0.0.1
        async with self.session.get(self.url) as page:  # the page with the token sets the cookie its connection sends
            assert page.status == 200, page.status
        websocket_url = self._origin.replace("http", "ws", 1) + f"/ws?width={self.width}&height={self.height}"
        self.socket = await self.session.ws_connect(websocket_url, max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        await self.socket.send_json(["resize", {"width": self.width, "height": self.height}])
        await self.socket.send_json(["ping", str(int(time.time() * 1000))])
        return self

    async def _read(self) -> None:
        async for message in self.socket:
            if message.type == aiohttp.WSMsgType.BINARY:
                self.drawn += message.data
                self.frames.append(message.data)
            elif message.type == aiohttp.WSMsgType.TEXT and message.data.startswith('["pong"'):
                self.pongs += 1
        self.closed = True

    def text(self, since: int = 0) -> str:
        return ANSI.sub(b"", bytes(self.drawn[since:])).decode(errors="replace")

    def frames_from(self, word: bytes) -> list[bytes]:
        """The frames from the last one that holds `word` on."""
        last = max(index for index, frame in enumerate(self.frames) if word in frame)
        return self.frames[last:]

    def farthest_cell(self, since: int = 0) -> tuple[int, int]:
        """The lowest row and the rightmost column the terminal's cursor was sent to (1-based), since `since`."""
        moves = [(int(row), int(column)) for row, column in CURSOR_TO.findall(bytes(self.drawn[since:]))]
        return (max((row for row, _ in moves), default=0), max((column for _, column in moves), default=0))

    async def wait_for_text(self, *words: str, since: int = 0, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(word in self.text(since) for word in words):
            assert time.monotonic() < deadline, f"never drawn: {words}; drawn: {self.text(since)[-800:]!r}"
            await asyncio.sleep(0.1)

    async def press(self, keys: str) -> None:
        await self.socket.send_json(["stdin", keys])

    async def resize(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        await self.socket.send_json(["resize", {"width": width, "height": height}])

    async def close(self) -> None:
        await self.socket.close()
        self._reader.cancel()
        await self.session.close()

    async def vanish(self) -> None:
        """The tab goes without a closing handshake: its connection is dropped (a killed browser, a lost network)."""
        response = self.socket._response
        response.connection.transport.abort()  # type: ignore[union-attr]
        response.close()  # the client's own bookkeeping of the connection, already dropped
        self._reader.cancel()
        await self.session.close()


class StalledTab:
    """A tab whose client never reads its socket once the connection is open: a raw socket that does the websocket
    handshake by hand (with the page's cookie) and then reads nothing more, with a small receive buffer."""

    def __init__(self, url: str, width: int = 120, height: int = 40) -> None:
        origin, token = url.split("/?token=", 1)
        self.host, port = origin.removeprefix("http://").rsplit(":", 1)
        self.port = int(port)
        self.token = token
        self.width, self.height = width, height

    def open(self) -> StalledTab:
        self.socket = socket.socket()
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.socket.connect((self.host, self.port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.socket.sendall(
            (
                f"GET /ws?width={self.width}&height={self.height} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\nCookie: gpuanat_serve_{self.port}={self.token}\r\n\r\n"
            ).encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += self.socket.recv(1)  # one byte at a time: nothing past the handshake is read
        assert answer.startswith(b"HTTP/1.1 101"), answer
        return self

    def close(self) -> None:
        self.socket.close()
