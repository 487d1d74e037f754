"""Braille cells for line charts: a plot as the dot bits of 2 × 4-dot braille glyphs, each value a dot joined to the
previous one, and the first column where two plots differ (so a chart redraws only the cells that changed).

Pure functions on lists of ints: no widget, no style. `LineChart` (`line_chart`) makes rows of them.
"""

from __future__ import annotations

from collections.abc import Mapping

BRAILLE_BLANK = 0x2800
"""U+2800, the braille cell with no dot; each dot adds a bit."""
BRAILLE_DOTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
"""The bit of the dot at [row from the top, 0-3][column, 0-1] of a braille cell."""
GLYPHS = (" ", *(chr(BRAILLE_BLANK + bits) for bits in range(1, 256)))
"""The glyph of each braille cell by its dot bits; a cell without a dot is a space."""


def line_cells(
    columns_by_series: Mapping[int, list[float | None]], top: float, rows: int, columns: int
) -> tuple[list[list[int]], list[list[int | None]]]:
    """The plot as braille cells, top row first: each cell's dot bits, and the series drawn last there. Each series'
    values are one per dot column (2 per cell column); each value is a dot at its height, joined to the previous
    value's."""
    bits_rows = [[0] * columns for _ in range(rows)]
    owner_rows: list[list[int | None]] = [[None] * columns for _ in range(rows)]
    draw_cells(bits_rows, owner_rows, columns_by_series, top, 0)
    return bits_rows, owner_rows


def draw_cells(
    bits_rows: list[list[int]],
    owner_rows: list[list[int | None]],
    columns_by_series: Mapping[int, list[float | None]],
    top: float,
    first_column: int,
) -> None:
    """Draw the series into the cells from `first_column` on (blank there); the cells left of it depend only on the
    values left of it."""
    rows, columns = len(bits_rows), len(bits_rows[0]) if bits_rows else 0
    dots_high = rows * 4
    scale = (dots_high - 1) / top if top > 0 else 0.0
    top_dot = dots_high - 1
    dot_bits = [(row_dots[0], row_dots[1]) for row_dots in BRAILLE_DOTS]
    first_x = first_column * 2

    def height_of(value: float) -> int:
        height = round(value * scale)
        return top_dot if height > top_dot else 0 if height < 0 else height

    for index, values in columns_by_series.items():
        before = values[first_x - 1] if 0 < first_x <= len(values) else None
        previous: int | None = None if before is None else height_of(before)
        for x in range(first_x, min(len(values), columns * 2)):
            value = values[x]
            if value is None:
                previous = None
                continue
            height = height_of(value)
            low, high = (
                (height, height)
                if previous is None or previous == height
                else ((previous, height) if previous < height else (height, previous))
            )
            column, side = x >> 1, x & 1
            for from_top in range(top_dot - high, top_dot - low + 1):
                row = from_top >> 2
                bits_rows[row][column] |= dot_bits[from_top & 3][side]
                owner_rows[row][column] = index
            previous = height


def first_difference(before: list[float | None], after: list[float | None]) -> int:
    """The first index where two lists of one length differ (their length where none does); bisected with slice
    comparisons, which run in C."""
    low, high = 0, len(after)
    if before == after:
        return high
    while low < high:
        middle = (low + high) // 2
        if before[: middle + 1] == after[: middle + 1]:
            low = middle + 1
        else:
            high = middle
    return low
