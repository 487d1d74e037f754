"""`gpuanat serve`: the same dashboard in a browser, through textual-serve (the Textual project's own server).

    gpuanat serve [--host HOST] [--port PORT] [-- DASHBOARD FLAGS]
    gpuanat serve [--host HOST] [--port PORT] watch PID

The server runs `gpuanat` (or `gpuanat watch PID`) as textual-serve runs any Textual app, drawn in the page — one
dashboard, drawn in every open tab and kept while tabs come and go (`serve_session.py`, `serve_tab.py`): closing the tab
never stops a run, opening the URL again shows the same dashboard, a slow tab holds up no other. Safe by default: bound
to 127.0.0.1 (reach it over `ssh -L`), and every page and connection needs the token printed when the server starts — in
the URL, as Jupyter does, then in a cookie that only this server's port reads; without it the page is refused (403).
Stopping the server quits the dashboard as `q` does: a run in progress is stopped and recorded, never left behind
unrecorded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import logging
import re
import secrets
import shlex
import sys
import traceback
from typing import Any
from urllib.parse import unquote_plus

from gpuanat.cli.common import EXIT_OK, check_history_of, fail_usage
from gpuanat.core.export.metrics import beyond_loopback_warning
from gpuanat.core.run.python_command import python_module_command
from gpuanat.core.store.history_errors import HistoryError

TOKEN_BYTES = 24
TOKEN_IN_URL = re.compile(r"([?&]token=)[^&#\s\"']*")
"""A token in a logged URL (the request's, or the referrer's), right or wrong, up to the next parameter."""
ANY_QUERY = re.compile(r"\?[^\s\"']*")
"""A URL's whole query string, hidden where the token is in it written with %-escapes."""


def served_command(served: list[str]) -> list[str]:
    """The gpuanat command each browser tab runs: the dashboard with `served`'s flags, or `watch PID`. Refuses (usage
    error) anything else, and what the dashboard itself would refuse, before the server starts."""
    from gpuanat.cli.parser import build_parser

    arguments = served[1:] if served[:1] == ["--"] else served
    try:
        parsed = build_parser().parse_args(arguments)
    except SystemExit:
        fail_usage(f"serve: cannot serve `gpuanat {shlex.join(arguments)}` (see the error above)")
    if parsed.command not in (None, "watch"):
        fail_usage(f"serve: serves the dashboard (its flags after --) or `watch PID`, not `{parsed.command}`")
    if parsed.command == "watch" and parsed.json:
        fail_usage("serve watch: --json prints records, there is nothing to draw in a browser")
    try:
        check_history_of(parsed)
    except HistoryError as error:
        fail_usage(f"serve: {error}")
    return python_module_command("gpuanat", *arguments)


def _server_class() -> Any:
    try:
        from aiohttp import web
        from textual_serve.server import Server, to_int
    except ImportError:
        fail_usage("gpuanat serve needs textual-serve: pip install 'gpuanat[serve]'")
    from gpuanat.cli.serve_session import DashboardSession

    class TokenServer(Server):
        """textual-serve's server, each page and connection asking for the token, and its URLs those of the request
        (a browser that reaches it through `ssh -L 9000:localhost:8000` is sent to port 9000, not 8000)."""

        def __init__(self, command: str, host: str, port: int, token: str, debug_log: bool = False) -> None:
            super().__init__(command, host=host, port=port, title="gpuanat")
            self.token = token
            self.debug_log = debug_log
            self.cookie = f"gpuanat_serve_{port}"
            self.session = DashboardSession(command, self.download_manager)

        def initialize_logging(self) -> None:
            """textual-serve's log (aiohttp's access log among it, and gpuanat's own lines about tabs) on the
            terminal, without the token: a request's line holds its URL and referrer, an error's traceback the
            request it failed on, and a terminal's output is often kept in a file. Tracebacks show no local
            variables (the token is one of them). With `--debug`, every logger at debug level."""
            super().initialize_logging()
            root = logging.getLogger()
            if self.debug_log:
                root.setLevel(logging.DEBUG)
            for handler in root.handlers:
                handler.addFilter(self._without_token)
                if hasattr(handler, "tracebacks_show_locals"):
                    handler.tracebacks_show_locals = False

        def _redacted(self, text: str) -> str:
            """`text` with `token=…` for any token in a URL, and `…` for this server's token wherever it is — also
            written with %-escapes (then every query string in the line is hidden)."""
            redacted = TOKEN_IN_URL.sub(r"\1…", text).replace(self.token, "…")
            if self.token in unquote_plus(redacted):
                redacted = ANY_QUERY.sub("?…", redacted)
                if self.token in unquote_plus(redacted):
                    redacted = unquote_plus(redacted).replace(self.token, "…")
            return redacted

        def _without_token(self, record: logging.LogRecord) -> bool:
            message = record.getMessage()
            redacted = self._redacted(message)
            if record.exc_info and record.exc_info[1] is not None:  # the traceback as text, if it holds the token
                trace = "".join(traceback.format_exception(*record.exc_info))
                if self._redacted(trace) != trace:
                    redacted = f"{redacted}\n{self._redacted(trace)}"
                    record.exc_info, record.exc_text = None, None
            if redacted != message:
                record.msg, record.args = redacted, None
            return True

        async def _make_app(self) -> Any:
            app = await super()._make_app()
            app.middlewares.append(self._require_token)
            return app

        @web.middleware
        async def _require_token(self, request: Any, handler: Any) -> Any:
            if request.path.startswith("/static/"):  # textual-serve's own scripts and fonts: nothing of the user's
                return await handler(request)
            given = request.query.get("token", "")
            if given and hmac.compare_digest(given, self.token):
                response = await handler(request)
                if not response.prepared:  # the page: the token kept for its connection, on this port only
                    response.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict")
                return response
            if hmac.compare_digest(request.cookies.get(self.cookie, ""), self.token):
                return await handler(request)
            raise web.HTTPForbidden(
                text="gpuanat serve: open the URL with the token that `gpuanat serve` printed "
                "when it started (…/?token=…)\n"
            )

        async def handle_index(self, request: Any) -> Any:
            self.public_url = f"{request.scheme}://{request.host}"
            return await super().handle_index(request)

        async def on_startup(self, app: Any) -> None:  # gpuanat prints its own line (the URL with the token)
            return None

        async def handle_websocket(self, request: Any) -> Any:
            """A tab's terminal: one more view of the one dashboard until the tab goes (which leaves it running)."""
            socket = web.WebSocketResponse(heartbeat=15)
            await socket.prepare(request)
            with contextlib.suppress(asyncio.CancelledError):
                await self.session.serve_tab(
                    socket,
                    request.transport,
                    str(request.remote),
                    to_int(request.query.get("width", "80"), 80),
                    to_int(request.query.get("height", "24"), 24),
                )
            return socket

        async def on_shutdown(self, app: Any) -> None:
            await self.session.stop()

    return TokenServer


def command_serve(args: argparse.Namespace) -> int:
    command = served_command(args.served)
    server_class = _server_class()
    token = secrets.token_urlsafe(TOKEN_BYTES)
    server = server_class(shlex.join(command), args.host, args.port, token, args.debug)
    warning = beyond_loopback_warning(args.host, "gpuanat serve")
    if warning:
        print(f"gpuanat: {warning}", file=sys.stderr)
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"gpuanat serve: open http://{host}:{args.port}/?token={token} (over SSH: ssh -L "
        f"{args.port}:localhost:{args.port} THIS-HOST, then that URL); Ctrl+C stops the server",
        flush=True,
    )
    try:
        server.serve()
    except OSError as error:
        fail_usage(f"serve: cannot listen on {args.host}:{args.port}: {error.strerror or error}")
    return EXIT_OK
