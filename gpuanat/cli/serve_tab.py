"""One browser tab of `gpuanat serve`: its connection, its size and focus, what the dashboard draws on its way to it.

The dashboard's output goes to every tab. Handing it to a tab never waits: each tab has its own queue, bounded, and its
own task that writes the queue out. A tab that reads slowly falls behind alone — the dashboard and the other tabs go on
— and a tab too far behind is skipped ahead: what it has not received yet is dropped (a terminal that missed part of a
screen can only be drawn again, not caught up), and once its connection has taken what was already sent, the whole
screen is drawn again for it. A tab whose connection takes nothing for `SEND_TIMEOUT_S` (a client that stopped reading,
a laptop whose lid closed) is cut off, so what the server holds for it is bounded too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

BEHIND_LIMIT_BYTES = 1 << 20
"""What a tab may have waiting to be sent before it is skipped ahead: 1 MiB, about 20 whole screens of the dashboard at
120×40 in truecolor — a tab that far behind shows a past no one asked for."""

SEND_TIMEOUT_S = 20.0
"""A tab whose connection takes no data for this long is cut off (aiohttp's heartbeat of 15 s, which needs the client
to read, would leave it open while the kernel's buffers hold what was sent)."""

CLOSE_TIMEOUT_S = 5.0
"""How long a tab's closing handshake may take before its connection is cut."""

log = logging.getLogger("gpuanat.serve")


class Tab:
    """A browser tab's websocket (aiohttp's `WebSocketResponse`), its transport, the terminal size its page asked for,
    whether its page has the keyboard's focus, and the bounded queue of what is still to be sent to it."""

    def __init__(
        self, socket: Any, transport: Any, peer: str, width: int, height: int, redraw: Callable[[], None]
    ) -> None:
        self.socket = socket
        self.transport = transport
        """The connection under the websocket: aborted to cut off a tab that stopped reading."""
        self.peer = peer
        """The client's address, for the log."""
        self.width = width
        self.height = height
        self.focused = False
        self.skipped_frames = 0
        """Frames of the dashboard's output this tab never received, because it was too far behind."""
        self._redraw = redraw
        self._pending: deque[bytes | str] = deque()
        self._pending_bytes = 0
        self._behind = False
        self._wake = asyncio.Event()
        self._closed = False
        self._writer = asyncio.create_task(self._write_out())

    @property
    def pending_bytes(self) -> int:
        """What is waiting to be sent to this tab."""
        return self._pending_bytes

    def send(self, data: bytes | str) -> None:
        """Queue `data` (terminal output as bytes, or a JSON message as text) for this tab; never waits."""
        if self._closed:
            return
        if self._behind:
            self.skipped_frames += 1
            return
        if self._pending and self._pending_bytes + len(data) > BEHIND_LIMIT_BYTES:
            self.skipped_frames += len(self._pending) + 1
            self._pending.clear()
            self._pending_bytes = 0
            self._behind = True
            log.info("tab %s: %d bytes behind, skipped ahead to the next whole screen", self.peer, BEHIND_LIMIT_BYTES)
        else:
            self._pending.append(data)
            self._pending_bytes += len(data)
        self._wake.set()

    async def _write_out(self) -> None:
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                data = self._pending.popleft()
                self._pending_bytes -= len(data)
                try:
                    await asyncio.wait_for(self._send_now(data), SEND_TIMEOUT_S)
                except TimeoutError:
                    log.info("tab %s: its connection took nothing for %.0f s, cut off", self.peer, SEND_TIMEOUT_S)
                    self.cut_off()
                    return
                except Exception:  # the connection went: its handler sees it end and detaches the tab
                    return
            if self._behind:  # caught up with what was sent before the skip: the whole screen again
                self._behind = False
                self._redraw()

    async def _send_now(self, data: bytes | str) -> None:
        if isinstance(data, bytes):
            await self.socket.send_bytes(data)
        else:
            await self.socket.send_str(data)

    def cut_off(self) -> None:
        """Drop the connection without a closing handshake (the client would not read one)."""
        if self.transport is not None:
            self.transport.abort()

    async def close(self, message: str = "") -> None:
        """Stop writing to this tab and close its connection (cut it if the handshake does not finish)."""
        self._closed = True  # not awaited after its cancel: asyncio.wait_for can swallow a cancel (Python 3.11)
        self._writer.cancel()
        self._wake.set()
        self._pending.clear()
        self._pending_bytes = 0
        with contextlib.suppress(Exception):  # TimeoutError, or the connection already gone
            await asyncio.wait_for(self.socket.close(message=message.encode()), CLOSE_TIMEOUT_S)
        # A connection closed with data still unsent (aiohttp's heartbeat closing a client that stopped reading) waits
        # to send it, holding its socket for as long as the client lives: let it go now.
        self.cut_off()
