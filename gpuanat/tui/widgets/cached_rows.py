"""CachedRows: a Line API widget whose rows are built at once and kept, and that repaints only the cells that changed.

Over SSH every repainted cell costs bytes: Textual sends a refreshed widget's whole region, each segment with its
full colour escape, whether it changed or not. The dashboards' hot widgets (charts, memory bar, status line, the
watched process) change a few cells per sample — a legend value, the newest column, a step counter — so
`repaint_changes()` rebuilds the rows, compares them with those on screen, and refreshes only the span of each row
from its first to its last changed cell: a refresh that changes nothing on screen sends nothing (issue #18). With
the partial updates the dashboards install (`gpuanat.tui.textual_internals`), Textual sends just that span.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.style import Style as TextualStyle
from textual.visual import Visual, visualize
from textual.widget import Widget

StyleRuns = list[tuple[int, Style | None]]
"""A strip's styles: (end cell, style) per segment, left to right."""


def _text_and_runs(strip: Strip) -> tuple[str, StyleRuns] | None:
    """The strip's characters and its style runs; None where a glyph is not one cell wide or a segment is a control
    (then the row is compared whole)."""
    texts: list[str] = []
    runs: StyleRuns = []
    end = 0
    for text, style, control in strip:
        if control or cell_len(text) != len(text):
            return None
        if text:
            end += len(text)
            texts.append(text)
            runs.append((end, style))
    return "".join(texts), runs


def _first_style_change(before: StyleRuns, after: StyleRuns) -> int:
    """The first cell whose style differs (the row's length where none does); both cover the same cells."""
    i = j = position = 0
    while i < len(before) and j < len(after):
        (end_before, style_before), (end_after, style_after) = before[i], after[j]
        if style_before is not style_after and style_before != style_after:
            return position
        position = min(end_before, end_after)
        i += end_before == position
        j += end_after == position
    return position


def _end_of_style_changes(before: StyleRuns, after: StyleRuns, width: int) -> int:
    """One past the last cell whose style differs (0 where none does); both cover `width` cells."""
    i, j, position = len(before) - 1, len(after) - 1, width
    while i >= 0 and j >= 0:
        start_before, start_after = before[i - 1][0] if i else 0, after[j - 1][0] if j else 0
        style_before, style_after = before[i][1], after[j][1]
        if style_before is not style_after and style_before != style_after:
            return position
        position = max(start_before, start_after)
        i -= start_before == position
        j -= start_after == position
    return 0


def _same_head(before: str, after: str) -> int:
    """How many leading characters two strings of one length share (bisected with slice comparisons, in C)."""
    low, high = 0, len(before)
    while low < high:
        middle = (low + high + 1) // 2
        if before[:middle] == after[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _same_tail(before: str, after: str) -> int:
    """How many trailing characters two strings of one length share."""
    low, high = 0, len(before)
    while low < high:
        middle = (low + high + 1) // 2
        if before[-middle:] == after[-middle:]:
            low = middle
        else:
            high = middle - 1
    return low


def changed_span(before: Strip, after: Strip) -> tuple[int, int] | None:
    """The cells from the first to the last that differ between two rows, as (start, end); None where they show the
    same. Compared as text and style runs, not cell by cell: equal cells in differently cut segments are equal."""
    old, new = _text_and_runs(before), _text_and_runs(after)
    if old is None or new is None or len(old[0]) != len(new[0]):
        width = max(before.cell_length, after.cell_length)
        return (0, width) if before != after else None
    (old_text, old_runs), (new_text, new_runs) = old, new
    width = len(new_text)
    same_head = _same_head(old_text, new_text)
    start = min(same_head, _first_style_change(old_runs, new_runs))
    if start == width:
        return None
    same_tail = _same_tail(old_text, new_text) if same_head < width else width
    end = max(width - same_tail, _end_of_style_changes(old_runs, new_runs, width))
    return start, end


def changed_regions(shown: Sequence[Strip], new: Sequence[Strip]) -> list[Region] | None:
    """The cells of `new` that differ from `shown`: per changed row, one region from its first to its last changed
    cell. None when the row counts differ (everything is to be repainted)."""
    if len(shown) != len(new):
        return None
    regions = []
    for y, (before, after) in enumerate(zip(shown, new, strict=True)):
        if before is after or before == after:
            continue
        span = changed_span(before, after)
        if span is not None:
            regions.append(Region(span[0], y, span[1] - span[0], 1))
    return regions


def text_rows(widget: Widget, text: Text, width: int, height: int | None) -> list[Strip]:
    """`text` as `widget` would render it from `render()`, padded to `width` (None `height`: as many rows as it
    takes)."""
    return Visual.to_strips(widget, visualize(widget, text, markup=False), width, height, widget.visual_style, pad=True)


def text_line_row(widget: Widget, line: Text, width: int, y: int) -> Strip:
    """Line `y` of a text, one that fits `width`, as `text_rows` makes it from the whole text: rendered alone, then
    given its place (the offsets in its styles by which Textual maps the mouse to a text selection) and padded."""
    style = widget.visual_style
    (row,) = Visual.to_strips(widget, visualize(widget, line, markup=False), width, None, style) or [Strip([])]
    return row.apply_offsets(0, y).extend_cell_length(width, (style + TextualStyle(reverse=False)).rich_style)


def text_height(widget: Widget, text: Text, width: int) -> int:
    """The rows `text` takes at `width` in `widget`, as Textual's layout counts them for `height: auto`."""
    # Textual's layout passes a widget's styles here too (`Widget._get_box_model`); it annotates the rules map only.
    return visualize(widget, text, markup=False).get_height(widget.styles, width)  # type: ignore[arg-type]


class CachedRows(Widget):
    """Subclasses build their rows in `build_rows` and say in `rows_key` what those depend on besides the size."""

    def __init__(
        self, *, name: str | None = None, id: str | None = None, classes: str | None = None, disabled: bool = False
    ) -> None:
        super().__init__(name=name, id=id, classes=classes, disabled=disabled)
        self._rows: list[Strip] = []
        self._built_key: tuple[Size, Hashable] | None = None
        self._base_style = Style()
        self._styles_known = False
        """Whether `_base_style` and `_component_rich_styles` are those of the current styles."""
        self._component_rich_styles: dict[str, Style] = {}
        self.repainted_cells = 0
        """Cells repainted by `repaint_changes` since mount (tests check that an unchanged picture sends none)."""

    def rows_key(self) -> Hashable:
        """What the rows depend on besides the widget's size and the theme (data versions, settings)."""
        raise NotImplementedError

    def build_rows(self, width: int, height: int) -> list[Strip]:
        """The widget's rows, `width` cells each; `self._base_style` is the widget's style, `component_style` gives
        its component classes'."""
        raise NotImplementedError

    def component_style(self, name: str) -> Style:
        """The Rich style of component class `name`, kept until the widget's styles change. Textual's own
        `get_component_rich_style` forgets it at every refresh and walks the ancestors again: for a widget that
        repaints a few cells at every sample, most of what its rows cost to build."""
        if not self._styles_known:
            self._forget_styles()
        style = self._component_rich_styles.get(name)
        if style is None:
            style = self._component_rich_styles[name] = self.get_component_rich_style(name)
        return style

    def _forget_styles(self) -> None:
        self._component_rich_styles.clear()
        self._base_style = self.rich_style  # walks the ancestors
        self._styles_known = True

    def _build(self, key: tuple[Size, Hashable]) -> None:
        if not self._styles_known:
            self._forget_styles()
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
        self._styles_known = False
