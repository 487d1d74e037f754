"""The app around a dashboard screen: a thin shell that both dashboards' apps (`GpuAnatApp`, `WatchApp`) share.

It shows its dashboard (`gpuanat.tui.screens.dashboard`) as the bottom of the screen stack — the base screen of its
one mode, so that the app is ready only once the dashboard is mounted — and routes to it what comes to the app: the
terminal's size, the process's stop signals, and the keys. The dashboard's keys are the app's `BINDINGS` (declared
with the dashboard's screen), so that they stay in force, and in the footer, under the history and compare panes
pushed on top of it (Textual looks a key up from the current screen to the app, never through the screens below);
each key's action is handed to the dashboard. The shell says every notification as plain text and keeps them
(`notices`); it installs the partial screen updates (`gpuanat.tui.textual_internals`) when it is built, so that no
import patches Textual.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from textual import events
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.markup import escape as escape_markup
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widgets import Input

from gpuanat.core.printable import printable
from gpuanat.core.run.stop_signals import STOP_SIGNALS, detach_from_terminal
from gpuanat.core.vocabulary.techniques import TECHNIQUES_BY_FIELD
from gpuanat.tui.screens.dashboard import DashboardScreen
from gpuanat.tui.screens.keys import CYCLING_ACTIONS, TECHNIQUE_ACTION
from gpuanat.tui.textual_internals import character_to_key, install_partial_updates

HANGUP_RECORDING_TIMEOUT_S = 60.0
"""After a hangup, how long a stopping run may take to be recorded before the dashboard leaves anyway (the
run's stop itself takes at most about 12 s; the history finalises what is left on its next open)."""
KEPT_NOTICES = 1_000
"""Notifications kept in `notices` (a dashboard says a few per run)."""


@dataclass(frozen=True)
class Notice:
    """A notification the app said, as shown (plain text)."""

    message: str
    severity: SeverityLevel
    title: str = ""


TYPED_KEYS = frozenset(character_to_key(chr(code)) for code in range(0x21, 0x7F))
"""The keys of the printable ASCII characters as Textual names them ("+" is `plus`): what a text field types."""

DashboardT = TypeVar("DashboardT", bound=DashboardScreen)
DASHBOARD_MODE = "dashboard"
"""The app's one mode, whose base screen is the dashboard."""


def _palette_help(binding: Binding) -> str:
    """The command palette's line under a key's name: what a technique key does, else the key's own words."""
    technique = TECHNIQUE_ACTION.match(binding.action)
    field = technique.group(1) if technique else CYCLING_ACTIONS.get(binding.action)
    info = TECHNIQUES_BY_FIELD.get(field) if field else None
    return f"gpuanat · {info.help}" if info else f"gpuanat · {binding.description.lower()}"


class DashboardApp(App[None], Generic[DashboardT]):
    """An app whose default screen is its `dashboard`, with the dashboard's keys as its `BINDINGS`."""

    CSS_PATH = "app.tcss"
    DEFAULT_MODE = DASHBOARD_MODE

    def __init__(self, dashboard: DashboardT, *, keymap: dict[str, str] | None = None) -> None:
        super().__init__()
        install_partial_updates()
        self.dashboard = dashboard
        """The dashboard screen, the bottom of the stack under any dialog or pane."""
        self.notices: collections.deque[Notice] = collections.deque(maxlen=KEPT_NOTICES)
        """Every notification said so far (the latest `KEPT_NOTICES`), also those whose toast has gone."""
        self.stop_signal: int | None = None
        """The stop signal (SIGINT, SIGTERM, SIGHUP) that ended the dashboard, if one did."""
        # The dashboard is the base screen of the app's one mode, not `get_default_screen()`'s: Textual awaits a mode's
        # base screen's mount while the app composes, so the app is ready (`run_test`'s pilot, an autopilot) only once
        # the dashboard has composed and run its `on_mount` (its sampler, its session). A default screen is started
        # without that wait, and a pilot could drive a dashboard not yet mounted.
        self.add_mode(DASHBOARD_MODE, self._dashboard_screen)
        self._remapped_keys: dict[str, str] = dict(keymap or {})
        """The user's keymap (binding id → keys), for `check_action` to know each binding's keys."""
        if keymap:
            self.set_keymap(keymap)

    def _dashboard_screen(self) -> Screen[None]:
        return self.dashboard

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """While a text field has the focus (the history's filter, a run's new name), an action whose every key is a
        character it types is neither shown nor run: the field takes the key. Textual leaves out of the footer the
        letters the field takes, but not the keys it names by words (`plus`, `minus`, `question_mark`, …), so the
        footer advertised `+ Batch+` while `+` went into the filter."""
        return not (isinstance(self.focused, Input) and self._typed_keys_only(action))

    def _typed_keys_only(self, action: str) -> bool:
        keys = [
            key.strip()
            for binding in self.BINDINGS
            if isinstance(binding, Binding) and binding.action.split("(")[0] == action
            for key in self._remapped_keys.get(binding.id or "", binding.key).split(",")
        ]
        return bool(keys) and all(key in TYPED_KEYS for key in keys)

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """Every notification as plain text: it quotes names, paths and children's errors, which are data (their
        controls escaped, their brackets shown), and gpuanat's own words keep their brackets too. `markup` is
        Textual's signature, and ignored."""
        shown, shown_title = printable(message, keep="\n"), printable(title)
        self.notices.append(Notice(shown, severity, shown_title))
        super().notify(shown, title=shown_title, severity=severity, timeout=timeout, markup=False)

    def on_mount(self) -> None:
        self._listen_for_stop_signals()

    def on_unmount(self) -> None:
        self._forget_stop_signals()

    def on_resize(self, event: events.Resize) -> None:
        if self.dashboard.is_mounted:  # before, the dashboard fits itself to the terminal as it mounts
            self.dashboard.fit_layout(event.size.height)

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for binding in self.BINDINGS:
            if isinstance(binding, Binding) and binding.description:
                # The palette parses help as markup: escaped, "pip install 'gpuanat[llm]'" keeps its brackets.
                yield SystemCommand(
                    f"{binding.description} ({binding.key_display or binding.key})",
                    escape_markup(_palette_help(binding)),
                    lambda b=binding: self.run_action(b.action),
                )

    # --- the keys both dashboards have, handed to the dashboard -------------------------------------
    async def action_quit(self) -> None:
        """q, ctrl+c and Textual's ctrl+q: the dashboard's quit, which asks first while a run is live."""
        self.dashboard.action_quit()

    def action_help(self) -> None:
        self.dashboard.action_help()

    def action_history(self) -> None:
        self.dashboard.action_history()

    def action_modules(self) -> None:
        self.dashboard.action_modules()

    def action_compare(self) -> None:
        self.dashboard.action_compare()

    def action_pause(self) -> None:
        self.dashboard.action_pause()

    def action_zoom(self) -> None:
        self.dashboard.action_zoom()

    def action_redraw(self) -> None:
        self.dashboard.action_redraw()

    # --- stop signals ------------------------------------------------------------------------------
    def _listen_for_stop_signals(self) -> None:
        """SIGTERM, SIGHUP (the SSH connection dropped) and a SIGINT sent from outside end the dashboard as
        q does, without asking: a run in progress is stopped and recorded first. Only on the main thread, where
        the dashboard runs for real; tests drive it from theirs."""
        with contextlib.suppress(RuntimeError, ValueError):
            loop = asyncio.get_running_loop()
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self._on_stop_signal, sig)

    def _forget_stop_signals(self) -> None:
        with contextlib.suppress(RuntimeError, ValueError):
            loop = asyncio.get_running_loop()
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)

    def _on_stop_signal(self, signum: int) -> None:
        if self.stop_signal is not None:
            return
        self.stop_signal = signum
        if signum == signal.SIGHUP:
            detach_from_terminal()
            self.run_worker(
                self._leave_after_hangup, name="gpuanat-hangup", group="hangup", thread=True, exit_on_error=False
            )
        self.dashboard.stop_and_quit()

    def _leave_after_hangup(self) -> None:
        """The terminal is gone, and Textual's teardown, which restores it, can wait forever on a writer that
        died with it (seen with Textual 8.2.8): once what is in progress is recorded, the process leaves."""
        self.dashboard.finish_recording(HANGUP_RECORDING_TIMEOUT_S)
        os._exit(128 + signal.SIGHUP)
