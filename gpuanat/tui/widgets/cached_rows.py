"""CachedRows: a Line API widget whose rows are built at once and kept, and that repaints only the cells that changed.

Over SSH every repainted cell costs bytes: Textual sends a refreshed widget's whole region, each segment with its
full colour escape, whether it changed or not. The dashboards' hot widgets (charts, memory bar, status line, the
watched process) change a few cells per sample — a legend value, the newest column, a step counter — so
`repaint_changes()` rebuilds the rows, compares them with those on screen, and refreshes only the span of each row
from its first to its last changed cell: a refresh that changes nothing on screen sends nothing (issue #18). With
`partial_update`, Textual sends just that span.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.visual import Visual, visualize
from textual.widget import Widget

from gpuanat.tui.widgets.partial_update import send_changed_spans_only

send_changed_spans_only()  # a changed span is sent from its first cell, not from the start of its line segment

Cell = tuple[str, Style | None]


def _cells(strip: Strip) -> list[Cell] | None:
    """The strip cell by cell; None where a glyph is not one cell wide (then the row is compared whole)."""
    cells: list[Cell] = []
    for segment in strip:
        text, style, control = segment
        if control or segment.cell_length != len(text):
            return None
        cells.extend((character, style) for character in text)
    return cells


def changed_regions(shown: Sequence[Strip], new: Sequence[Strip]) -> list[Region] | None:
    """The cells of `new` that differ from `shown`: per changed row, one region from its first to its last changed
    cell. None when the row counts differ (everything is to be repainted)."""
    if len(shown) != len(new):
        return None
    regions = []
    for y, (before, after) in enumerate(zip(shown, new, strict=True)):
        if before is after or before == after:
            continue
        before_cells, after_cells = _cells(before), _cells(after)
        if before_cells is None or after_cells is None or len(before_cells) != len(after_cells):
            regions.append(Region(0, y, max(before.cell_length, after.cell_length), 1))
            continue
        changed = [x for x, (was, now) in enumerate(zip(before_cells, after_cells, strict=True)) if was != now]
        if changed:  # equal cells in differently cut segments compare unequal as strips, equal here
            regions.append(Region(changed[0], y, changed[-1] - changed[0] + 1, 1))
    return regions


def text_rows(widget: Widget, text: Text, width: int, height: int | None) -> list[Strip]:
    """`text` as `widget` would render it from `render()`, padded to `width` (None `height`: as many rows as it
    takes)."""
    return Visual.to_strips(widget, visualize(widget, text, markup=False), width, height, widget.visual_style,
                            pad=True)


def text_height(widget: Widget, text: Text, width: int) -> int:
    """The rows `text` takes at `width` in `widget`, as Textual's layout counts them for `height: auto`."""
    return visualize(widget, text, markup=False).get_height(widget.styles, width)


class CachedRows(Widget):
    """Subclasses build their rows in `build_rows` and say in `rows_key` what those depend on besides the size."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None,
                 disabled: bool = False) -> None:
        super().__init__(name=name, id=id, classes=classes, disabled=disabled)
        self._rows: list[Strip] = []
        self._built_key: tuple[Size, Hashable] | None = None
        self._base_style = Style()
        self.repainted_cells = 0
        """Cells repainted by `repaint_changes` since mount (tests check that an unchanged picture sends none)."""

    def rows_key(self) -> Hashable:
        """What the rows depend on besides the widget's size and the theme (data versions, settings)."""
        raise NotImplementedError

    def build_rows(self, width: int, height: int) -> list[Strip]:
        """The widget's rows, `width` cells each; `self._base_style` is the widget's style."""
        raise NotImplementedError

    def _build(self, key: tuple[Size, Hashable]) -> None:
        self._base_style = self.rich_style  # walks the ancestors: once per build, not per row
        width, height = key[0]
        self._rows = self.build_rows(width, height)
        self._built_key = key

    def render_line(self, y: int) -> Strip:
        key = (self.size, self.rows_key())
        if key != self._built_key:
            self._build(key)
        if y < len(self._rows):
            return self._rows[y]
        return Strip.blank(self.size.width, self.rich_style)

    def repaint_changes(self, *, layout: bool = False) -> None:
        """Show the widget's new state: rebuild the rows now and repaint only the cells that differ from the rows on
        screen. The whole widget is repainted where its size may change (`layout`), where it was never painted at
        this size, or where the number of rows changed."""
        if layout or not self.is_mounted or self._built_key is None or self._built_key[0] != self.size:
            self._built_key = None
            self.refresh(layout=layout)
            return
        key = (self.size, self.rows_key())
        if key == self._built_key:
            return
        shown = self._rows
        self._build(key)
        regions = changed_regions(shown, self._rows)
        if regions is None:
            self.refresh()
        elif regions:
            self.repainted_cells += sum(region.area for region in regions)
            self.refresh(*regions)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._built_key = None  # the theme changed: colours baked into the rows are stale
