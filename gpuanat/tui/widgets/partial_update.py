"""Partial screen updates that send the changed cells only, not the line segment they sit in.

Textual 8.2.8 sends a refreshed region line by line in "chops", the pieces of a screen line between widget edges;
`ChopsUpdate.render_segments` crops a chop at the end of the refreshed span but sends it from the chop's start, so a
legend value changing at the right of a chart's title row resends the whole title, and a new chart column the plot
row left of it. Over SSH that was most of what the dashboards wrote (issue #18: 6.4 KB/s of `gpuanat watch`'s
replay, 1.9 KB/s with this). `send_changed_spans_only()` makes a chop start at the span's first cell (or at the
segment holding it, where the cut would split a wide glyph). Only for the Textual version whose method it replaces;
any other sends as Textual does (more bytes, same picture).
"""

from __future__ import annotations

import textual
from rich.cells import cell_len
from rich.console import Console
from rich.control import Control
from textual._compositor import ChopsUpdate
from textual.strip import Strip

PATCHED_TEXTUAL_VERSION = "8.2.8"


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
