"""Every recorded run (this session's and earlier ones), newest last; pick runs to compare.

As in htop and nvitop: `<` and `>` choose the column the rows are sorted by (its title marked ▲ or ▼), `I` inverts
the order, `/` filters the rows to those whose name, status, model, techniques, device or tags contain the text typed
(escape clears the filter). `n` renames the run under the cursor (`screens/rename.py`), `t` tags the selected runs (or
the one under the cursor), `d` deletes them after asking (`screens/confirm.py`): each saved through what the dashboard
gives the screen, off the event loop, since the history may be busy for a while. A tune's or fit's trials show as one
row, its search (`core/store/searches.py`), until `e` expands it; `e` on one of its trials folds it again. A long
history's table holds PAGE_ROWS rows, `m` adds more; the filter and the sort work on every run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Label

from gpuanat.core.printable import printable
from gpuanat.core.store.history import Deleted, RunRow
from gpuanat.core.store.history_errors import HistoryError
from gpuanat.core.store.report import TAGS_COLUMN, counted, display_value
from gpuanat.tui.screens.confirm import ConfirmScreen
from gpuanat.tui.screens.history_table import (
    PAGE_ROWS,
    SCREEN_COLUMNS,
    SORT_KEYS,
    filtered_rows,
    sorted_rows,
    table_rows,
)
from gpuanat.tui.screens.rename import RenameScreen, TagScreen
from gpuanat.tui.text_fit import fit_words

SELECTED_MARK = "✓"
DELETE_LISTED = 10
"""The most runs `d`'s question lists one a line; more are counted."""
Rename = Callable[[int, str | None], bool]
"""Saves a run's new name (None: no name) in the history; False when the run is not there. Blocks: called off the
event loop. Raises HistoryError when the history cannot take it."""
Tag = Callable[[list[int], str], int]
"""Tags the runs with the tag; how many did not have it. Blocks, off the event loop; raises HistoryError."""
Delete = Callable[[list[int]], Deleted]
"""Deletes the runs (`HistoryStore.delete_runs`). Blocks, off the event loop; raises HistoryError (RunInProgress for a
run another process records)."""


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
        Binding("t", "tag", "Tag", id="history.tag"),
        Binding("d", "delete", "Delete", id="history.delete"),
        Binding("e", "expand", "Expand", id="history.expand"),
        Binding("m", "more", f"{PAGE_ROWS} more rows", id="history.more"),
        Binding("h,escape", "close", "Back", id="history.back"),
    ]
    DEFAULT_CSS = """
    HistoryScreen DataTable { height: 1fr; }
    HistoryScreen #history-hint { color: $text-muted; padding: 0 1; }
    HistoryScreen #history-filter { display: none; }
    HistoryScreen.-filtering #history-filter { display: block; }
    """

    def __init__(
        self, runs: list[RunRow], rename: Rename | None = None, tag: Tag | None = None, delete: Delete | None = None
    ) -> None:
        """`rename` saves a new name (`Rename`), `tag` a tag (`Tag`), `delete` deletes runs (`Delete`); without one
        its key is not offered."""
        super().__init__()
        self._runs = runs
        self._rename = rename
        self._tag = tag
        self._delete = delete
        self.expanded: set[int] = set()
        """The searches whose trials show one a row."""
        self._rows = table_rows(runs, self.expanded)
        self.selected: list[str] = []
        """The selected rows' keys: a run's id, or a folded search's ("s3")."""
        self.sort_key = "id"
        self.descending = False
        self.filter_text = ""
        self.row_limit = PAGE_ROWS
        """The most rows the table holds (`m` raises it)."""
        self._hidden_rows = 0
        """The rows the filter keeps that the table does not hold yet."""

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
        self._fill(cursor_key=self._rows[-1]["key"] if self._rows else None)

    @property
    def run_rows(self) -> list[dict[str, Any]]:
        """Every run's row, as given (before the filter and the sort)."""
        return self._rows

    @property
    def shown_run_ids(self) -> list[int]:
        """The runs the table shows, in its order (a folded search's best trial for it)."""
        return [row["run_id"] for row in self._shown_rows()]

    @property
    def shown_keys(self) -> list[str]:
        """The rows the table shows, in its order: run ids, and "s3" for a folded search."""
        return [row["key"] for row in self._shown_rows()]

    def _shown_rows(self) -> list[dict[str, Any]]:
        return self._window(self._matching_rows())

    def _window(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Of the filtered and sorted `rows`, those the table holds: the `row_limit` newest in the run order (in any
        other order the top ones)."""
        if len(rows) <= self.row_limit:
            return rows
        return rows[-self.row_limit :] if self.sort_key == "id" and not self.descending else rows[: self.row_limit]

    def _matching_rows(self) -> list[dict[str, Any]]:
        key = "order" if self.sort_key == "id" else self.sort_key
        return sorted_rows(filtered_rows(self._rows, self.filter_text), key, self.descending)

    def _columns(self) -> tuple[Any, ...]:
        """The screen's columns, and the tags where a run has any."""
        return (*SCREEN_COLUMNS, TAGS_COLUMN) if any(row["tags"] for row in self._rows) else SCREEN_COLUMNS

    def _fill(self, cursor_key: str | None = None) -> None:
        """(Re)build the table: the filter, then the sort; the cursor stays on the row it was on where shown."""
        table = self.query_one(DataTable)
        if cursor_key is None and table.row_count:
            cursor_key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        table.clear(columns=True)
        table.add_column(" ", key="selected")
        columns = self._columns()
        for column in columns:
            mark = (" ▼" if self.descending else " ▲") if column.key == self.sort_key else ""
            table.add_column(column.title + mark, key=column.key)
        every = self._matching_rows()
        matching, rows = len(every), self._window(every)
        for row in rows:
            # Text, not markup: names, models and tags read as given (display_value made them printable).
            table.add_row(
                SELECTED_MARK if row["key"] in self.selected else "",
                *(Text(display_value(column.key, row.get(column.key))) for column in columns),
                key=row["key"],
            )
        keys = [row["key"] for row in rows]
        if keys:
            table.move_cursor(row=keys.index(cursor_key) if cursor_key in keys else len(keys) - 1)
        shown = f"{matching} of {counted(len(self._rows), 'run')}" if self.filter_text else counted(matching, "run")
        self._hidden_rows = matching - len(rows)
        self.refresh_bindings()
        if len(rows) < matching:
            shown += f" ({len(rows)} in the table, m: {min(PAGE_ROWS, matching - len(rows))} more)"
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
    def cursor_row(self) -> dict[str, Any] | None:
        """The row under the cursor (None in an empty table)."""
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((row for row in self._rows if row["key"] == key), None)

    @property
    def cursor_run_id(self) -> int | None:
        """The run under the cursor, a folded search's best trial (None in an empty table)."""
        row = self.cursor_row
        return None if row is None else int(row["run_id"])

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
        if action == "more":
            return self._hidden_rows > 0
        offered = {"rename": self._rename, "tag": self._tag, "delete": self._delete}
        return offered[action] is not None if action in offered else True

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
        self._refill()
        self._say(f"Run {run_id} is named “{name}” now." if name is not None else f"Run {run_id} has no name now.")

    def _refill(self) -> None:
        self._rows = table_rows(self._runs, self.expanded)
        known = {row["key"] for row in self._rows}
        self.selected = [key for key in self.selected if key in known]
        if self.is_attached:  # the user may have left the history while the history was written
            self._fill()

    def _say(self, message: str, severity: SeverityLevel = "information") -> None:
        self.notify(printable(message), severity=severity, markup=False)  # it quotes a name: data, never markup

    def _targets(self) -> list[RunRow]:
        """What `t` and `d` act on: the selected rows, else the row under the cursor; a folded search's every trial."""
        keys = self.selected or ([self.cursor_row["key"]] if self.cursor_row is not None else [])
        run_ids = {run_id for row in self._rows if row["key"] in keys for run_id in row["run_ids"]}
        return [run for run in self._runs if run.id in run_ids]

    def action_tag(self) -> None:
        runs = self._targets()
        if self._tag is None or not runs:
            return

        def typed(tag: str | None) -> None:
            if tag is not None and tag.strip():  # None: cancelled; a blank tag is no tag
                self._save_tag([run.id for run in runs], tag)

        self.app.push_screen(TagScreen([run.id for run in runs]), typed)

    @work(thread=True, exclusive=True, group="history-tag")
    def _save_tag(self, run_ids: list[int], tag: str) -> None:
        assert self._tag is not None
        try:
            self._tag(run_ids, tag)
        except HistoryError as error:
            self.app.call_from_thread(self._say, f"The tag was not saved: {error}", "error")
            return
        self.app.call_from_thread(self._show_tag, run_ids, tag)

    def _show_tag(self, run_ids: list[int], tag: str) -> None:
        self._runs = [
            dataclasses.replace(run, tags=tuple(sorted({*run.tags, tag}))) if run.id in run_ids else run
            for run in self._runs
        ]
        self._refill()
        self._say(f"{counted(len(run_ids), 'run')} tagged “{tag}”: {', '.join(map(str, run_ids))}.")

    def action_delete(self) -> None:
        runs = self._targets()
        if self._delete is None or not runs:
            return
        lines = [
            f"run {run.id} · {datetime.fromtimestamp(run.created_at):%Y-%m-%d %H:%M} · "
            + (f"“{run.name}”" if run.name is not None else "(no name)")
            + f" · {run.status}"
            for run in runs
        ]
        left = len(lines) - (DELETE_LISTED - 1)
        shown = lines if len(lines) <= DELETE_LISTED else [*lines[: DELETE_LISTED - 1], f"… and {left} more"]
        question = f"Delete {counted(len(runs), 'run')} with their steps, samples, tags and logs?"

        def answered(yes: bool | None) -> None:
            if yes:
                self._delete_runs([run.id for run in runs])

        self.app.push_screen(ConfirmScreen(question, shown), answered)

    @work(thread=True, exclusive=True, group="history-delete")
    def _delete_runs(self, run_ids: list[int]) -> None:
        assert self._delete is not None
        try:
            deleted = self._delete(run_ids)
        except HistoryError as error:
            self.app.call_from_thread(self._say, f"Nothing was deleted: {error}", "error")
            return
        self.app.call_from_thread(self._show_deleted, deleted)

    def _show_deleted(self, deleted: Deleted) -> None:
        self._runs = [run for run in self._runs if run.id not in deleted.run_ids]
        self._refill()
        self._say(f"Deleted {counted(len(deleted.run_ids), 'run')}: {', '.join(map(str, deleted.run_ids))}.")

    def action_expand(self) -> None:
        """A folded search's row shows its trials; a trial's row folds its search again."""
        row = self.cursor_row
        if row is None:
            return
        run = next(run for run in self._runs if run.id == row["run_id"])
        if run.search is None:
            self.notify("Not a tune's or fit's trial: nothing to expand.", timeout=3)
            return
        folded = run.search.id not in self.expanded
        (self.expanded.add if folded else self.expanded.discard)(run.search.id)
        self._rows = table_rows(self._runs, self.expanded)
        self._fill(cursor_key=str(run.id) if folded else f"s{run.search.id}")

    def action_more(self) -> None:
        """`PAGE_ROWS` more rows in the table; the cursor stays on its row."""
        self.row_limit += PAGE_ROWS
        self._fill()

    def action_toggle_selection(self) -> None:
        table = self.query_one(DataTable)
        row = self.cursor_row
        if row is None:
            return
        key = row["key"]
        if key in self.selected:
            self.selected.remove(key)
        else:
            self.selected.append(key)
        table.update_cell(key, "selected", SELECTED_MARK if key in self.selected else "")
        table.action_cursor_down()

    def action_compare(self) -> None:
        if self.has_class("-filtering"):  # enter in the filter: keep it, back to the table
            self._end_filtering(keep=True)
            return
        by_key = {row["key"]: row["run_id"] for row in self._rows}
        run_ids = [by_key[key] for key in self.selected]
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
