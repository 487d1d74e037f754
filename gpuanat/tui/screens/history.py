"""Every recorded run (this session's and earlier ones), newest last; pick runs to compare."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Label

from gpuanat.core.store.history import RunRow
from gpuanat.core.store.report import HISTORY_COLUMNS, display_value, history_rows

SELECTED_MARK = "✓"
SCREEN_COLUMN_ORDER = ("id", "when", "name", "status", "techniques", "time_s", "samples_per_second",
                       "steady_samples_per_second", "peak_allocated", "gpu_memory_mb", "prediction_error_delta",
                       "model", "device")
"""The metrics come before the long model and device names so that 120 columns show them."""
SCREEN_COLUMNS = tuple(next(c for c in HISTORY_COLUMNS if c.key == key) for key in SCREEN_COLUMN_ORDER)


class HistoryScreen(Screen[list[int]]):
    """Dismisses with the selected run ids when the user asks to compare (enter)."""

    BINDINGS = [
        Binding("space", "toggle_selection", "Select", id="history.select"),
        Binding("enter", "compare", "Compare selected", id="history.compare", priority=True),
        Binding("h,escape", "close", "Back", id="history.back"),
    ]
    DEFAULT_CSS = """
    HistoryScreen DataTable { height: 1fr; }
    HistoryScreen #history-hint { color: $text-muted; padding: 0 1; }
    """

    def __init__(self, runs: list[RunRow]) -> None:
        super().__init__()
        self._runs = runs
        self.selected: list[int] = []

    def compose(self) -> ComposeResult:
        yield Label("History — space selects runs, enter compares them (the first selected is the baseline)",
                    id="history-hint")
        yield DataTable(id="history-table", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_column(" ", key="selected")
        for column in SCREEN_COLUMNS:
            table.add_column(column.title, key=column.key)
        for row in history_rows(self._runs):
            row["when"] = row["when"][5:]  # the year goes: MM-DD HH:MM
            table.add_row("", *(display_value(column.key, row.get(column.key)) for column in SCREEN_COLUMNS),
                          key=str(row["id"]))
        if self._runs:
            table.move_cursor(row=len(self._runs) - 1)

    def action_toggle_selection(self) -> None:
        table = self.query_one(DataTable)
        if not self._runs:
            return
        run_id = int(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value or 0)
        if run_id in self.selected:
            self.selected.remove(run_id)
        else:
            self.selected.append(run_id)
        table.update_cell(str(run_id), "selected", SELECTED_MARK if run_id in self.selected else "")
        table.action_cursor_down()

    def action_compare(self) -> None:
        if len(self.selected) < 2:
            self.notify("Select two or more runs with space first.", severity="warning")
            return
        self.dismiss(list(self.selected))

    def action_close(self) -> None:
        self.dismiss([])
