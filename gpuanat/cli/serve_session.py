"""The one dashboard a `gpuanat serve` keeps: it outlives the browser tabs that show it, as a tmux session outlives
the SSH connection it was started from.

textual-serve starts an app process per websocket and quits it when the websocket closes; for a long run watched from
a laptop that would stop the run with the tab. Here the server holds one `AppService` (textual-serve's own process
manager, unchanged) and points its output at whichever tab is attached: a tab that closes detaches (the dashboard and
its run go on, their output dropped), the next tab that opens the URL attaches, and gets the terminal's modes and a
full repaint; a second tab takes the dashboard over from the first, whose connection is closed. `q` in the dashboard
ends it (the next tab starts a fresh one), and so does stopping the server: then the dashboard quits as it does after
`q`, a run in progress stopped and recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

TERMINAL_MODES = (
    "\x1b[?1049h"  # the alternate screen
    "\x1b[?1000h\x1b[?1003h\x1b[?1015h\x1b[?1006h"  # mouse reporting, as Textual's web driver asks
    "\x1b[?25l"  # no cursor
    "\x1b[?2004h"
)  # bracketed paste
"""What Textual's web driver writes once when its app starts (`WebDriver.start_application_mode`): a tab that attaches
later needs it too."""

REDRAW_KEY = b"\x0c"
"""ctrl+l, the dashboards' "redraw the whole screen" (a resize to the size they already have changes nothing)."""

TAKEN_OVER = "gpuanat serve: another tab took this dashboard"


class DashboardSession:
    """One app process (textual-serve's `AppService` running `command`) and the websocket that shows it, if any."""

    def __init__(self, command: str, download_manager: Any) -> None:
        self.command = command
        self.download_manager = download_manager
        self.service: Any = None
        self.socket: Any = None
        self._lock = asyncio.Lock()

    @property
    def running(self) -> bool:
        task = getattr(self.service, "_task", None)
        return task is not None and not task.done()

    async def attach(self, socket: Any, width: int, height: int) -> Any:
        """Show the dashboard in `socket`'s tab, starting it if none runs; returns the `AppService` to send input to."""
        from textual_serve.app_service import AppService

        async with self._lock:
            previous, self.socket = self.socket, socket
            if previous is not None and previous is not socket:
                with contextlib.suppress(Exception):
                    await previous.close(message=TAKEN_OVER.encode())
            if not self.running:
                self.service = AppService(
                    self.command,
                    write_bytes=self._write_bytes,
                    write_str=self._write_str,
                    close=self._close,
                    download_manager=self.download_manager,
                )
                await self.service.start(width, height)
                return self.service
            await self._write_bytes(TERMINAL_MODES.encode())
            await self.service.set_terminal_size(width, height)
            await self.service.send_bytes(REDRAW_KEY)  # the dashboard's ctrl+l: every cell again, for the new tab
            return self.service

    def detach(self, socket: Any) -> None:
        """`socket`'s tab is gone: the dashboard goes on, unseen."""
        if self.socket is socket:
            self.socket = None

    async def stop(self) -> None:
        """Quit the dashboard as `q` does (the server is stopping)."""
        if self.service is not None:
            await self.service.stop()

    async def _write_bytes(self, data: bytes) -> None:
        socket = self.socket
        if socket is not None:
            with contextlib.suppress(Exception):  # a tab closing mid-frame: the next frame goes to the next tab
                await socket.send_bytes(data)

    async def _write_str(self, data: str) -> None:
        socket = self.socket
        if socket is not None:
            with contextlib.suppress(Exception):
                await socket.send_str(data)

    async def _close(self) -> None:
        """The app exited (`q`): its tab's connection closes."""
        socket, self.socket = self.socket, None
        if socket is not None:
            with contextlib.suppress(Exception):
                await socket.close()
