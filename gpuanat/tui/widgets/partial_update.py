"""Partial screen updates that send the changed cells only, not the line segment they sit in.

Textual 8.2.8 sends a refreshed region line by line in "chops", the pieces of a screen line between widget edges;
`ChopsUpdate.render_segments` crops a chop at the end of the refreshed span but sends it from the chop's start, so a
legend value changing at the right of a chart's title row resends the whole title, and a new chart column the plot
row left of it. Over SSH that was most of what the dashboards wrote (issue #18: 6.4 KB/s of `gpuanat watch`'s
replay, 1.9 KB/s with this). `send_changed_spans_only()` makes a chop start at the span's first cell (or at the
segment holding it, where the cut would split a wide glyph).

Before sending, `Compositor._render_chops` renders every line of every widget that the bounding box of the update's
regions touches, though only the lines holding a changed span are sent: a legend value at the top of the screen and
one at the bottom had every widget between render all its lines, at every sample. `render_sent_lines_only()` makes
it render, of each widget, only the rows from its first to its last line that is sent, and none of a widget that has
no such line; the chops it returns are the same.

Both only for the Textual version whose methods they replace; any other sends and renders as Textual does (more
bytes and work, same picture).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence

import textual
from rich.cells import cell_len
from rich.console import Console
from rich.control import Control
from textual._compositor import ChopsUpdate, Compositor
from textual.geometry import Region
from textual.strip import Strip

PATCHED_TEXTUAL_VERSION = "8.2.8"
TEXTUAL_RENDER_CHOPS = Compositor._render_chops
"""Textual's own, kept for the test that compares the two."""


def _span_start(strip: Strip, x: int, x1: int) -> int:
    """Where to start sending `strip` (at screen column `x`) for a span from `x1`: `x1`, or the start of the
    segment holding it where that segment has wide glyphs."""
    for segment in strip:
        width = cell_len(segment.text)
        if x + width > x1:
            return x1 if width == len(segment.text) else x
        x += width
    return x1


def render_segments(self: ChopsUpdate, console: Console) -> str:
    """`ChopsUpdate.render_segments` of Textual 8.2.8, with each chop sent from the span's start, not its own."""
    sequences: list[str] = []
    append = sequences.append
    move_to = Control.move_to
    last_y = self.spans[-1][0]
    for y, x1, x2 in self.spans:
        for end, (x, strip) in zip(self.chop_ends[y], self.chops[y].items(), strict=False):
            if strip is None or x > x2 or end <= x1:
                continue
            start = _span_start(strip, x, x1) if x < x1 else x
            if start != x or end > x2:
                strip = strip.crop(start - x, min(end, x2) - x)
            append(move_to(start, y).segment.text)
            append(strip.render(console))
        if y != last_y:
            append("\n")
    return "".join(sequences)


def send_changed_spans_only() -> bool:
    """Install `render_segments` in Textual's `ChopsUpdate` (once); False where Textual is not the version it
    replaces."""
    if textual.__version__ != PATCHED_TEXTUAL_VERSION:
        return False
    ChopsUpdate.render_segments = render_segments  # type: ignore[method-assign]
    return True


def render_chops(
    self: Compositor, crop: Region, is_rendered_line: Callable[[int], bool]
) -> Sequence[Mapping[int, Strip | None]]:
    """`Compositor._render_chops` of Textual 8.2.8, rendering of each widget (front to back, the first render of a
    cut wins) only the rows from its first to its last line that is sent."""
    cuts = self.cuts
    chops: list[dict[int, Strip | None]] = [dict.fromkeys(cut_set[:-1]) for cut_set in cuts]
    sent_lines = [y for y in range(crop.y, crop.bottom) if is_rendered_line(y)]
    crop_overlaps = crop.overlaps
    for widget, (region, clip) in self.visible_widgets.items():
        if not crop_overlaps(clip):
            continue
        render_region = region.intersection(clip)
        x, y, width, height = render_region
        first = bisect.bisect_left(sent_lines, y)
        last = bisect.bisect_left(sent_lines, y + height)
        if not width or first == last:
            continue
        top, bottom = sent_lines[first], sent_lines[last - 1] + 1
        strips = widget.render_lines(Region(x - region.x, top - region.y, width, bottom - top))
        first_cut, last_cut = render_region.column_span
        for line_y, strip in zip(range(top, bottom), strips, strict=False):
            if not is_rendered_line(line_y):
                continue
            chops_line = chops[line_y]
            final_cuts = [cut for cut in cuts[line_y] if last_cut >= cut >= first_cut]
            cut_strips = strip.divide([cut - x for cut in final_cuts[1:]])
            for cut, cut_strip in zip(final_cuts, cut_strips, strict=False):
                if chops_line.get(cut) is None:
                    chops_line[cut] = cut_strip
    return chops


def render_sent_lines_only() -> bool:
    """Install `render_chops` in Textual's `Compositor` (once); False where Textual is not the version it replaces."""
    if textual.__version__ != PATCHED_TEXTUAL_VERSION:
        return False
    Compositor._render_chops = render_chops  # type: ignore[method-assign]
    return True
