"""Everything gpuanat takes from Textual's private modules, in one place, with what happens on another Textual.

gpuanat was written against Textual 8.2.8 (`WRITTEN_AGAINST`; the `test` extra pins it, the runtime dependency is
a range). Three private names are used, each for a reason Textual's public API does not serve:

- `textual._keyboard_protocol.FUNCTIONAL_KEYS`: the named keys terminals report through the kitty keyboard protocol
  (media keys, f25-f35, ...), so that the keymap (`gpuanat.tui.keymap`) accepts them. On a Textual without it, the
  keymap knows the names in the public `textual.keys.Keys` only, and refuses the others with its usual line.
- `textual.keys._character_to_key`: how Textual names the key of a typed character ("+" -> "plus"), so that a
  remapped key is written as Textual reports it. On a Textual without it, `character_to_key` does what 8.2.8's did,
  from the public tables of `textual.keys`.
- `textual._compositor.ChopsUpdate.render_segments` and `Compositor._render_chops`: replaced, to send the changed
  cells only and to render only the lines that are sent (below). Installed only by `install_partial_updates()`,
  which the dashboards' App calls when it is built (importing a widget patches nothing), and only on the version
  written against: any other Textual keeps its own methods and sends and renders as it does (more bytes and work,
  the same picture).

Partial screen updates. Textual 8.2.8 sends a refreshed region line by line in "chops", the pieces of a screen line
between widget edges; `ChopsUpdate.render_segments` crops a chop at the end of the refreshed span but sends it from
the chop's start, so a legend value changing at the right of a chart's title row resends the whole title, and a new
chart column the plot row left of it. `send_changed_spans_only()` makes a chop start at the span's first cell (or at
the segment holding it, where the cut would split a wide glyph); docs/cost.md has the bytes it saves.

Before sending, `Compositor._render_chops` renders every line of every widget that the bounding box of the update's
regions touches, though only the lines holding a changed span are sent. `render_sent_lines_only()` makes it render,
of each widget, only the rows from its first to its last line that is sent, and none of a widget that has no such
line; the chops it returns are the same.

These belong upstream; until then they stay here, where a Textual upgrade shows at once what it touches
(tests/test_textual_internals.py).
"""

from __future__ import annotations

import bisect
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import textual
import textual.keys
from rich.cells import cell_len
from rich.console import Console
from rich.control import Control
from textual.geometry import Region
from textual.strip import Strip

if TYPE_CHECKING:
    from textual._compositor import ChopsUpdate, Compositor
    from textual.screen import Screen

WRITTEN_AGAINST = "8.2.8"
"""The Textual version whose private names and methods this module was written against (and snapshots drawn with)."""

_FUNCTIONAL_KEYS: Mapping[str, str] = {}
_textual_character_to_key: Callable[[str], str] | None = None
try:  # private: absent or moved in another Textual
    from textual._keyboard_protocol import FUNCTIONAL_KEYS as _TEXTUAL_FUNCTIONAL_KEYS

    _FUNCTIONAL_KEYS = _TEXTUAL_FUNCTIONAL_KEYS
except ImportError:  # pragma: no cover - only on another Textual
    pass
try:
    from textual.keys import _character_to_key

    _textual_character_to_key = _character_to_key
except ImportError:  # pragma: no cover - only on another Textual
    pass
try:
    from textual import _compositor as _textual_compositor
except ImportError:  # pragma: no cover - only on another Textual
    _textual_compositor = None  # type: ignore[assignment]  # absent: the patches below are not installed

FUNCTIONAL_KEY_NAMES: frozenset[str] = frozenset(_FUNCTIONAL_KEYS.values())
"""Named keys reported through the kitty keyboard protocol; empty where Textual does not say."""
TEXTUAL_RENDER_CHOPS = _textual_compositor.Compositor._render_chops if _textual_compositor is not None else None
"""Textual's own, kept for the test that compares the two."""


INSTALLED_TEXTUAL: str = textual.__version__


def written_for(textual_version: str) -> bool:
    """Whether Textual `textual_version` is the version this module was written against (and its compositor module,
    which the patches replace methods of, is there)."""
    return textual_version == WRITTEN_AGAINST and _textual_compositor is not None


def character_to_key(character: str) -> str:
    """The name Textual gives the key of a typed `character` ("+" -> "plus", "a" -> "a")."""
    if _textual_character_to_key is not None:
        return _textual_character_to_key(character)
    return character_to_key_from_public_tables(character)


def character_to_key_from_public_tables(character: str) -> str:
    """Textual 8.2.8's `_character_to_key`, from the public tables of `textual.keys`."""
    if character.isalnum():
        key = character
    else:
        try:
            key = unicodedata.name(character).lower().replace("-", "_").replace(" ", "_")
        except ValueError:
            key = getattr(textual.keys, "ASCII_KEY_NAMES", {}).get(character, character)
    replacements: Mapping[str, str] = getattr(textual.keys, "KEY_NAME_REPLACEMENTS", {})
    return replacements.get(key, key)


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


def send_changed_spans_only(textual_version: str = INSTALLED_TEXTUAL) -> bool:
    """Install `render_segments` in Textual's `ChopsUpdate` (once); False, and nothing patched, where Textual
    (`textual_version`, the installed one) is not the version it replaces."""
    if not written_for(textual_version):
        return False
    # A method replaced on Textual's class, on purpose: the one way to change what its compositor sends.
    _textual_compositor.ChopsUpdate.render_segments = render_segments  # type: ignore[method-assign]
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


def render_sent_lines_only(textual_version: str = INSTALLED_TEXTUAL) -> bool:
    """Install `render_chops` in Textual's `Compositor` (once); False, and nothing patched, where Textual
    (`textual_version`, the installed one) is not the version it replaces."""
    if not written_for(textual_version):
        return False
    # A method replaced on Textual's class, on purpose: the one way to change what its compositor renders.
    # Textual declares its chops' values `Strip`, though its own hold None for a cut no widget rendered, as these do.
    _textual_compositor.Compositor._render_chops = render_chops  # type: ignore[method-assign, assignment]
    return True


def screen_compositor(screen: Screen[object]) -> Compositor:
    """The compositor of `screen` (private in Textual), for the tests and benchmarks that measure what it renders and
    sends."""
    return screen._compositor


def install_partial_updates(textual_version: str = INSTALLED_TEXTUAL) -> bool:
    """Both compositor patches above, applied by the dashboards' App when it is built (never on import). True when
    installed; False where Textual (`textual_version`, the installed one) is another version, which then sends and
    renders as it does."""
    return send_changed_spans_only(textual_version) and render_sent_lines_only(textual_version)
