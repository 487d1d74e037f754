"""A long table printed as Rich prints it, line by line: Rich lays out a table of ten thousand runs in some 20 s
(it measures and renders every cell through its console, about 2 ms a row); this writes the same characters —
the same heavy head, column widths, justification and ellipsis — in a fraction of a second. `print_table` uses it
for tables longer than PLAIN_FROM_ROWS, where every cell fits on one line (no column wraps): `write_long_table`.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from rich.cells import cell_len, set_cell_size

PLAIN_FROM_ROWS = 200
"""Tables with more rows than this are written here; shorter ones go through Rich."""
BOLD, PLAIN = "\x1b[1m", "\x1b[0m"


def _cells(text: str) -> int:
    """The cells `text` takes on a terminal: its length where it is ASCII (most cells, and Rich's count the slow
    way), else Rich's count."""
    return len(text) if text.isascii() else cell_len(text)


def _fitted(text: str, width: int, right: bool) -> str:
    """`text` in `width` cells: cut with an ellipsis when longer, padded on the side its justification leaves."""
    length = _cells(text)
    if length > width:
        return set_cell_size(text, width - 1) + "…" if width > 1 else "…"[:width]
    padding = " " * (width - length)
    return padding + text if right else text + padding


def write_long_table(
    stream: TextIO,
    columns: Sequence[Any],
    rows: Sequence[dict[str, Any]],
    max_widths: Mapping[str, int],
    *,
    bold_head: bool,
) -> bool:
    """`write_plain_table` where the table is longer than PLAIN_FROM_ROWS and no column wraps (a failure's "reason"
    does); False, writing nothing, where Rich is to lay it out."""
    if len(rows) <= PLAIN_FROM_ROWS or any(column.key == "reason" for column in columns):
        return False
    write_plain_table(stream, columns, rows, max_widths, bold_head=bold_head)
    return True


def write_plain_table(
    stream: TextIO,
    columns: Sequence[Any],
    rows: Sequence[dict[str, Any]],
    max_widths: Mapping[str, int],
    *,
    bold_head: bool,
) -> None:
    """Rich's `Table(show_edge=False)` of `rows` under `columns` (`report.Column`s; each cell shown by
    `report.display_value`, printable, on one line), numeric columns justified right, each column no wider than its
    `max_widths` entry (absent: as wide as its widest cell), the titles bold where `bold_head`."""
    from gpuanat.core.store.report import display_value

    texts = [[display_value(column.key, row.get(column.key)) for column in columns] for row in rows]
    widths = []
    for index, column in enumerate(columns):
        widest = max([_cells(column.title), *(_cells(row[index]) for row in texts)])
        limit = max_widths.get(column.key)
        widths.append(widest if limit is None else min(widest, limit))
    right = [bool(column.numeric) for column in columns]
    style, unstyle = (BOLD, PLAIN) if bold_head else ("", "")
    head = "┃".join(
        f" {style}{_fitted(column.title, width, is_right)}{unstyle} "
        for column, width, is_right in zip(columns, widths, right, strict=True)
    )
    lines = [head, "╇".join("━" * (width + 2) for width in widths)]
    for row in texts:
        cells = zip(row, widths, right, strict=True)
        lines.append("│".join(f" {_fitted(cell, width, is_right)} " for cell, width, is_right in cells))
    stream.write("\n".join(lines) + "\n")
