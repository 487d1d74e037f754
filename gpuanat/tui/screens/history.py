"""Every recorded run (this session's and earlier ones), newest last; pick runs to compare.

As in htop and nvitop: `<` and `>` choose the column the rows are sorted by (its title marked ▲ or ▼), `I` inverts
the order, `/` filters the rows to those whose name, status, model, techniques or device contain the text typed
(escape clears the filter). `n` renames the run under the cursor (`screens/rename.py`), saved through the `rename`
the dashboard gives the screen, off the event loop: the history may be busy for a while."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Label

from gpuanat.core.printable import printable
from gpuanat.core.store.history import RunRow
from gpuanat.core.store.history_errors import HistoryError
from gpuanat.core.store.report import HISTORY_COLUMNS, counted, display_value, history_rows
from gpuanat.tui.screens.rename import RenameScreen
from gpuanat.tui.text_fit import fit_words

SELECTED_MARK = "✓"
SCREEN_COLUMN_ORDER = (
    "id",
    "when",
    "name",
    "status",
    "techniques",
    "time_s",
    "samples_per_second",
    "steady_samples_per_second",
    "achieved_tflops",
    "mfu",
    "peak_allocated",
    "gpu_memory_mb",
    "prediction_error_delta",
    "model",
    "device",
)
"""The metrics come before the long model and device names so that 120 columns show them."""
SCREEN_COLUMNS = tuple(next(c for c in HISTORY_COLUMNS if c.key == key) for key in SCREEN_COLUMN_ORDER)
SORT_KEYS = (
    "id",
    "time_s",
    "samples_per_second",
    "steady_samples_per_second",
    "achieved_tflops",
    "mfu",
    "peak_allocated",
    "gpu_memory_mb",
    "prediction_error_delta",
    "status",
    "name",
    "model",
    "techniques",
    "device",
)
"""The columns `<` and `>` step through; `id` (the order the runs were made in) first."""
FILTERED_KEYS = ("name", "status", "model", "techniques", "device")
Rename = Callable[[int, str | None], bool]
"""Saves a run's new name (None: no name) in the history; False when the run is not there. Blocks: called off the
event loop. Raises HistoryError when the history cannot take it."""


def sorted_rows(rows: list[dict[str, Any]], key: str, descending: bool) -> list[dict[str, Any]]:
    """`rows` by `key`; rows without a value last either way (a failed run has no samples/s)."""
    present = [row for row in rows if row.get(key) is not None]
    missing = [row for row in rows if row.get(key) is None]
    return sorted(present, key=lambda row: row[key], reverse=descending) + missing


def filtered_rows(rows: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """The rows whose name, status, model, techniques or device contain `text` (any case)."""
    needle = text.strip().lower()
    if not needle:
        return rows
    return [row for row in rows if any(needle in str(row.get(key) or "").lower() for key in FILTERED_KEYS)]


class HistoryScreen(Screen[list[int]]):
    """Dismisses with the selected run ids when the user asks to compare (enter)."""

    BINDINGS = [
        Binding("space", "toggle_selection", "Select", id="history.select"),
        Binding("enter", "compare", "Compare selected", id="history.compare", priority=True),
        Binding("greater_than_sign", "sort_by(1)", "Sort: next column", id="history.sort_next", key_display=">"),
        Binding(
            "less_than_sign",
            "sort_by(-1)",
            "Sort: previous column",
            id="history.sort_previous",
            key_display="<",
            show=False,
        ),
        Binding("I", "invert_sort", "Invert order", id="history.invert", show=False),
        Binding("slash", "filter", "Filter", id="history.filter", key_display="/"),
        Binding("n", "rename", "Rename", id="history.rename"),
        Binding("h,escape", "close", "Back", id="history.back"),
    ]
    DEFAULT_CSS = """
    HistoryScreen DataTable { height: 1fr; }
    HistoryScreen #history-hint { color: $text-muted; padding: 0 1; }
    HistoryScreen #history-filter { display: none; }
    HistoryScreen.-filtering #history-filter { display: block; }
    """

    def __init__(self, runs: list[RunRow], rename: Rename | None = None) -> None:
        """`rename` saves a new name (`Rename`); without it `n` is not offered."""
        super().__init__()
        self._runs = runs
        self._rename = rename
        self._rows = self._table_rows(runs)
        self.selected: list[int] = []
        self.sort_key = "id"
        self.descending = False
        self.filter_text = ""

    def compose(self) -> ComposeResult:
        yield Label(
            "History — space selects runs, enter compares them or the last two (the first is the baseline)",
            id="history-hint",
        )
        yield DataTable(id="history-table", cursor_type="row", zebra_stripes=True)
        yield Input(
            placeholder="filter: name, status, model, techniques, device (enter keeps it, escape clears it)",
            id="history-filter",
        )
        yield Footer()

    def on_mount(self) -> None:
        self._fill(cursor_run_id=self._rows[-1]["id"] if self._rows else None)

    @staticmethod
    def _table_rows(runs: list[RunRow]) -> list[dict[str, Any]]:
        rows = history_rows(runs)
        for row in rows:
            row["when"] = row["when"][5:]  # the year goes: MM-DD HH:MM
        return rows

    @property
    def run_rows(self) -> list[dict[str, Any]]:
        """Every run's row, as given (before the filter and the sort)."""
        return self._rows

    @property
    def shown_run_ids(self) -> list[int]:
        """The runs the table shows, in its order."""
        return [row["id"] for row in self._shown_rows()]

    def _shown_rows(self) -> list[dict[str, Any]]:
        return sorted_rows(filtered_rows(self._rows, self.filter_text), self.sort_key, self.descending)

    def _fill(self, cursor_run_id: int | None = None) -> None:
        """(Re)build the table: the filter, then the sort; the cursor stays on the run it was on where shown."""
        table = self.query_one(DataTable)
        if cursor_run_id is None and table.row_count:
            cursor_run_id = int(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value or 0)
        table.clear(columns=True)
        table.add_column(" ", key="selected")
        for column in SCREEN_COLUMNS:
            mark = (" ▼" if self.descending else " ▲") if column.key == self.sort_key else ""
            table.add_column(column.title + mark, key=column.key)
        rows = self._shown_rows()
        for row in rows:
            # Text, not markup: names and models read as given (display_value made them printable).
            table.add_row(
                SELECTED_MARK if row["id"] in self.selected else "",
                *(Text(display_value(column.key, row.get(column.key))) for column in SCREEN_COLUMNS),
                key=str(row["id"]),
            )
        ids = [row["id"] for row in rows]
        if ids:
            table.move_cursor(row=ids.index(cursor_run_id) if cursor_run_id in ids else len(ids) - 1)
        shown = f"{len(rows)} of {counted(len(self._rows), 'run')}" if self.filter_text else counted(len(rows), "run")
        order = (
            ""
            if self.sort_key == "id" and not self.descending
            else f" · sorted by {next(c.title for c in SCREEN_COLUMNS if c.key == self.sort_key)}"
        )
        where = f" · filter “{printable(self.filter_text)}”" if self.filter_text else ""
        self._hint = (
            f"History — {shown}{order}{where} · space selects, enter compares them or the last two (the "
            "first is the baseline)"
        )
        self._show_hint()

    def _show_hint(self) -> None:
        """The hint line, its last words giving way to a narrow terminal whole."""
        hint = getattr(self, "_hint", "")
        self.query_one("#history-hint", Label).update(Text(fit_words(hint, self.size.width - 1) or hint))

    def on_resize(self) -> None:
        self._show_hint()

    def action_sort_by(self, step: int) -> None:
        self.sort_key = SORT_KEYS[(SORT_KEYS.index(self.sort_key) + step) % len(SORT_KEYS)]
        # numbers read best largest first; names and the run order ascending
        self.descending = self.sort_key not in ("id", "status", "name", "model", "techniques", "device")
        self._fill()

    def action_invert_sort(self) -> None:
        self.descending = not self.descending
        self._fill()

    def action_filter(self) -> None:
        self.add_class("-filtering")
        self.query_one(Input).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        self._fill()

    def _end_filtering(self, keep: bool) -> None:
        if not keep:
            self.query_one(Input).value = ""
            self.filter_text = ""
            self._fill()
        self.remove_class("-filtering")
        self.query_one(DataTable).focus()

    @property
    def cursor_run_id(self) -> int | None:
        """The run under the cursor (None in an empty table)."""
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        return int(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value or 0)

    @property
    def cursor_run(self) -> RunRow | None:
        """The run under the cursor, as the history holds it (None in an empty table)."""
        run_id = self.cursor_run_id
        return next((run for run in self._runs if run.id == run_id), None)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """`n` is offered where the dashboard can save a name; `/` is typed into the filter while it has the focus,
        and not advertised then."""
        if action == "filter":
            return not isinstance(self.focused, Input)
        return self._rename is not None if action == "rename" else True

    def action_rename(self) -> None:
        run_id = self.cursor_run_id
        if self._rename is None or run_id is None:
            return
        run = next(run for run in self._runs if run.id == run_id)

        def typed(name: str | None) -> None:
            if name is not None:  # None: cancelled
                self._save_name(run_id, name if name.strip() else None)

        self.app.push_screen(RenameScreen(run_id, run.name), typed)

    @work(thread=True, exclusive=True, group="history-rename")
    def _save_name(self, run_id: int, name: str | None) -> None:
        """Save the name (retried while the history is busy), then show it; the rows stay as they were if it could
        not be saved."""
        assert self._rename is not None
        try:
            renamed = self._rename(run_id, name)
        except HistoryError as error:
            self.app.call_from_thread(self._say, f"The name was not saved: {error}", "error")
            return
        if not renamed:
            self.app.call_from_thread(
                self._say, f"Run {run_id} is no longer in the history: the name was not saved.", "error"
            )
            return
        self.app.call_from_thread(self._show_name, run_id, name)

    def _show_name(self, run_id: int, name: str | None) -> None:
        self._runs = [dataclasses.replace(run, name=name) if run.id == run_id else run for run in self._runs]
        self._rows = self._table_rows(self._runs)
        if self.is_attached:  # the user may have left the history while the name was saved
            self._fill()
        self._say(f"Run {run_id} is named “{name}” now." if name is not None else f"Run {run_id} has no name now.")

    def _say(self, message: str, severity: SeverityLevel = "information") -> None:
        self.notify(printable(message), severity=severity, markup=False)  # it quotes a name: data, never markup

    def action_toggle_selection(self) -> None:
        table = self.query_one(DataTable)
        run_id = self.cursor_run_id
        if run_id is None:
            return
        if run_id in self.selected:
            self.selected.remove(run_id)
        else:
            self.selected.append(run_id)
        table.update_cell(str(run_id), "selected", SELECTED_MARK if run_id in self.selected else "")
        table.action_cursor_down()

    def action_compare(self) -> None:
        if self.has_class("-filtering"):  # enter in the filter: keep it, back to the table
            self._end_filtering(keep=True)
            return
        run_ids = list(self.selected)
        if len(run_ids) < 2:  # the selected run and the latest other one, or the last two runs the table shows
            latest_first = sorted(self.shown_run_ids, reverse=True)
            run_ids = sorted(run_ids + [run_id for run_id in latest_first if run_id not in run_ids][: 2 - len(run_ids)])
        if len(run_ids) < 2:
            self.notify("Compare needs two runs: run twice, or clear the filter.", severity="warning")
            return
        self.dismiss(run_ids)

    def action_close(self) -> None:
        if self.has_class("-filtering") or self.filter_text:  # escape clears the filter before it leaves
            self._end_filtering(keep=False)
            return
        self.dismiss([])
