"""The one dashboard a `gpuanat serve` keeps, and every browser tab that shows it: as tmux with several clients, the
dashboard outlives the tabs, and every tab open on it shows it whole.

textual-serve starts an app process per websocket and quits it when the websocket closes; for a long run watched from
a laptop that would stop the run with the tab, and twenty tabs would be twenty dashboards, each with its own sampler,
each able to start runs on the same GPU. Here the server holds one `AppService` (textual-serve's own process manager,
unchanged) and sends what it draws to every attached tab (`serve_tab.Tab`: a bounded queue each, so a slow tab never
holds up the others). A tab that opens attaches and gets the terminal's modes and a full repaint; a tab that closes,
or whose connection vanishes, detaches — the dashboard and its run go on. Keys from any tab reach the dashboard, and
every tab sees what they do. The dashboard is drawn at the smallest size among the tabs (never below
`SMALLEST_SHARED_SIZE`), so it fits whole in each; a tab that resizes, opens or closes changes that size, and every tab
is cleared and drawn again. The dashboard has the keyboard's focus while any tab has it. `q` in the dashboard ends it
(every tab's connection closes; the next tab starts a fresh one), and so does stopping the server: then the dashboard
quits as it does after `q`, a run in progress stopped and recorded.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from aiohttp import WSMsgType

from gpuanat.cli.serve_tab import Tab, log

TERMINAL_MODES = (
    b"\x1b[?1049h"  # the alternate screen
    b"\x1b[?1000h\x1b[?1003h\x1b[?1015h\x1b[?1006h"  # mouse reporting, as Textual's web driver asks
    b"\x1b[?25l"  # no cursor
    b"\x1b[?2004h"
)  # bracketed paste
"""What Textual's web driver writes once when its app starts (`WebDriver.start_application_mode`): a tab that attaches
later needs it too."""

CLEAR_SCREEN = b"\x1b[2J"
"""Sent to every tab before the dashboard is drawn whole at a new size: a tab larger than the dashboard would otherwise
keep the old size's cells beyond the new one's edge."""

CURSOR_TO_CELL = re.compile(rb"\x1b\[(\d+);(\d+)H")
"""The cursor moved to a cell (row, column; from 1), where the dashboard draws a line."""

SETTLE_S = 0.5
"""How long after the dashboard's first screen a size is sure to reach it (one given earlier can be lost)."""

RESIZE_AGAIN_S = 0.25
"""How soon a dashboard seen drawing beyond the size it was given is given it again."""

REDRAW_KEY = b"\x0c"
"""ctrl+l, the dashboards' "redraw the whole screen" (a resize to the size they already have changes nothing)."""

REDRAW_DELAY_S = 0.05
"""Redraws asked for within this time (tabs opening together, tabs catching up) are one redraw, which every tab gets."""

SMALLEST_SHARED_SIZE = (40, 12)
"""A tab smaller than this (a window dragged almost shut) does not shrink the other tabs' dashboard below it."""

LARGEST_SIZE = (1000, 500)
"""Sizes a page asks for beyond this are taken as this."""


def _bounded(value: object, low: int, high: int, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return max(low, min(high, value))


class DashboardSession:
    """One app process (textual-serve's `AppService` running `command`) and the tabs that show it."""

    def __init__(self, command: str, download_manager: Any) -> None:
        self.command = command
        self.download_manager = download_manager
        self.service: Any = None
        self.tabs: list[Tab] = []
        self.size: tuple[int, int] | None = None
        """The size the dashboard was last given."""
        self.focused = False
        self._lock = asyncio.Lock()
        self._redraw: asyncio.Task[None] | None = None
        self._clear = False
        """Whether the next redraw clears every tab first (the dashboard's size changed)."""
        self._next_size_check = 0.0
        self._resize: asyncio.Task[None] | None = None
        self._started_size: tuple[int, int] | None = None
        self._settled: asyncio.Task[None] | None = None
        """Done once the dashboard's first screen has settled (`SETTLE_S` after it was drawn)."""

    @property
    def running(self) -> bool:
        task = getattr(self.service, "_task", None)
        return task is not None and not task.done()

    async def serve_tab(self, socket: Any, transport: Any, peer: str, width: int, height: int) -> None:
        """Show the dashboard in `socket`'s tab until the tab goes, handing its keys, size, focus and pings on."""
        tab = await self.attach(socket, transport, peer, width, height)
        try:
            async for message in socket:
                if message.type == WSMsgType.TEXT:
                    await self._take(tab, message.data)
        finally:
            await self.detach(tab)

    async def attach(self, socket: Any, transport: Any, peer: str, width: int, height: int) -> Tab:
        """Show the dashboard in `socket`'s tab, starting it if none runs."""
        from textual_serve.app_service import AppService

        async with self._lock:
            tab = Tab(
                socket,
                transport,
                peer,
                _bounded(width, 1, LARGEST_SIZE[0], 80),
                _bounded(height, 1, LARGEST_SIZE[1], 24),
                self.request_redraw,
            )
            self.tabs.append(tab)
            log.info("tab %s opened (%dx%d): %d tabs", peer, tab.width, tab.height, len(self.tabs))
            if not self.running:
                self.size = self._shared_size()
                self.service = AppService(
                    self.command,
                    write_bytes=self._write_bytes,
                    write_str=self._write_str,
                    close=self._close,
                    download_manager=self.download_manager,
                )
                self._started_size, self._settled = self.size, None
                await self.service.start(*self.size)
                return tab
            tab.send(TERMINAL_MODES)
            await self._fit()
            self.request_redraw()  # the dashboard's ctrl+l: every cell again, for the new tab
            return tab

    async def detach(self, tab: Tab) -> None:
        """`tab` is gone: the dashboard goes on, the other tabs' size and focus without it."""
        if tab in self.tabs:
            self.tabs.remove(tab)
        await tab.close()
        log.info("tab %s closed: %d tabs", tab.peer, len(self.tabs))
        async with self._lock:
            if self.running:
                await self._fit()
                await self._focus()

    async def stop(self) -> None:
        """Quit the dashboard as `q` does (the server is stopping)."""
        if self.service is not None:
            await self.service.stop()

    def request_redraw(self) -> None:
        """The whole screen again, for every tab, soon (requests close together are one)."""
        if self._redraw is None or self._redraw.done():
            self._redraw = asyncio.create_task(self._redraw_soon())

    async def _redraw_soon(self) -> None:
        await asyncio.sleep(REDRAW_DELAY_S)  # by then the dashboard drew its last frame at an old size
        if self._clear:
            self._clear = False
            self._write_to_tabs(CLEAR_SCREEN)
        if self.running:
            await self.service.send_bytes(REDRAW_KEY)

    async def _take(self, tab: Tab, text: str) -> None:
        """One message from a tab's page (textual-serve's protocol: `["stdin", keys]`, `["resize", {width, height}]`,
        `["ping", n]`, `["focus"]`, `["blur"]`); anything else is ignored."""
        try:
            envelope = json.loads(text)
        except ValueError:
            return
        if not isinstance(envelope, list) or not envelope:
            return
        kind, data = envelope[0], envelope[1] if len(envelope) > 1 else None
        if kind == "stdin" and isinstance(data, str) and self.running:
            await self.service.send_bytes(data.encode("utf-8"))
        elif kind == "resize" and isinstance(data, dict):
            async with self._lock:
                tab.width = _bounded(data.get("width"), 1, LARGEST_SIZE[0], tab.width)
                tab.height = _bounded(data.get("height"), 1, LARGEST_SIZE[1], tab.height)
                if self.running:
                    await self._fit()
        elif kind == "ping":
            tab.send(json.dumps(["pong", data]))
        elif kind in ("focus", "blur"):
            async with self._lock:
                tab.focused = kind == "focus"
                if self.running:
                    await self._focus()

    def _shared_size(self) -> tuple[int, int]:
        """The smallest width and height among the tabs, never below `SMALLEST_SHARED_SIZE`."""
        if not self.tabs:
            return self.size or (80, 24)
        return (
            max(SMALLEST_SHARED_SIZE[0], min(tab.width for tab in self.tabs)),
            max(SMALLEST_SHARED_SIZE[1], min(tab.height for tab in self.tabs)),
        )

    async def _fit(self) -> None:
        """Give the dashboard the tabs' shared size if it changed: every tab cleared, then drawn whole at it."""
        size = self._shared_size()
        if size == self.size:
            return
        self.size = size
        log.debug("the dashboard drawn at %dx%d, the smallest tab's size", *size)
        if self._settled is None or not self._settled.done():
            return  # given once the first screen has settled
        await self.service.set_terminal_size(*size)
        self._clear = True
        self.request_redraw()  # Textual redraws only what moved at a new size; a cleared tab needs every cell

    async def _focus(self) -> None:
        focused = any(tab.focused for tab in self.tabs)
        if focused != self.focused:
            self.focused = focused
            await (self.service.focus() if focused else self.service.blur())

    def _write_to_tabs(self, data: bytes | str) -> None:
        for tab in self.tabs:
            tab.send(data)

    async def _write_bytes(self, data: bytes) -> None:
        self._write_to_tabs(data)
        if self._settled is None:  # the first screen: sizes are taken once it has settled
            self._settled = asyncio.create_task(self._settle())
        elif (
            self._settled.done()
            and self.size is not None
            and time.monotonic() >= self._next_size_check
            and any(int(row) > self.size[1] or int(col) > self.size[0] for row, col in CURSOR_TO_CELL.findall(data))
        ):
            log.debug("the dashboard drew beyond %dx%d: its size given again", *self.size)
            self._next_size_check = time.monotonic() + RESIZE_AGAIN_S
            self._resize = asyncio.create_task(self._give_size())  # not awaited: this is the reader of its output

    async def _settle(self) -> None:
        await asyncio.sleep(SETTLE_S)
        if self.size is not None and self.size != self._started_size:
            await self._give_size()

    async def _give_size(self) -> None:
        """Give the dashboard its size again, surely: Textual keeps a size that came before its first screen settled
        without giving it to the screen, and a resize to the size it keeps changes nothing — one column less first
        makes the size a change again. Every tab cleared and drawn whole after."""
        assert self.size is not None
        self._next_size_check = time.monotonic() + RESIZE_AGAIN_S
        width, height = self.size
        await self.service.set_terminal_size(width - 1, height)
        await self.service.set_terminal_size(width, height)
        self._clear = True
        self.request_redraw()

    async def _write_str(self, data: str) -> None:
        self._write_to_tabs(data)

    async def _close(self) -> None:
        """The app exited (`q`): every tab's connection closes."""
        tabs, self.tabs = self.tabs, []
        self.size, self.focused = None, False
        await asyncio.gather(*(tab.close() for tab in tabs), return_exceptions=True)
