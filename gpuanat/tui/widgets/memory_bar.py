"""MemoryBar: GPU memory as one stacked bar of the anatomy's bands, a predicted bar under it, and a legend.

Bands are drawn in the order of `gpuanat.core.measure.anatomy.BAND_NAMES` (other processes first, free last), each with
its own glyph and colour, so they stay distinguishable even where a theme (e.g. `ansi-dark`) has few colours.
Both bars share one scale: the device total when known, else the larger of the two sums, so measured and
predicted compare by length. The legend has one row per band: swatch, name, current, peak and predicted value,
and for a band that could not be measured "—" with the reason, dimmed (the full reasons are in the tooltip).
A watched process that does not publish its anatomy shows its whole GPU memory as one more segment,
"watched process (not broken down)", between the tensor bands and free.
Drawn with the Line API from rows cached per (size, data version, theme); a new measurement repaints only the cells
it changes (`CachedRows`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.strip import Strip

from gpuanat.core.measure.anatomy import BAND_NAMES, NO_GPU_READINGS
from gpuanat.core.printable import printable
from gpuanat.core.store.report import format_bytes
from gpuanat.tui.widgets.cached_rows import CachedRows

BAND_LABELS: dict[str, str] = {
    "other_processes_bytes": "other processes",
    "cuda_context_bytes": "CUDA context",
    "weights_bytes": "weights",
    "gradients_bytes": "gradients",
    "optimizer_state_bytes": "optimizer state",
    "activations_bytes": "activations",
    "temporaries_and_cache_bytes": "temporaries & cache",
    "free_bytes": "free",
}
BAND_GLYPHS: dict[str, str] = {
    "other_processes_bytes": "▒",  # hatched: memory that is not this run's
    "cuda_context_bytes": "█",
    "weights_bytes": "█",
    "gradients_bytes": "█",
    "optimizer_state_bytes": "█",
    "activations_bytes": "█",
    "temporaries_and_cache_bytes": "▓",  # textured: transient or cached, next to the activations
    "free_bytes": "░",
}
LOGITS_GLYPH = "▆"
"""The logits' cells, carved out of the activations they are part of: the same colour family, another shape."""
LOGITS_COMPONENT = "memory-bar--logits"
UNATTRIBUTED_LABEL = "watched process"
UNATTRIBUTED_GLYPH = "▚"
"""Checkered: memory known to be the watched process's, not split into bands."""
LABEL_WIDTH = 10
"""Columns before a bar: "measured", "predicted"."""
MOMENT_NOTE = "each column: one moment, a forward pass's end"
"""The moment the bar and its columns show, said beside their header: a plain AdamW run's 0 MiB of gradients is
that moment's; their size after backward is the gradients row's note."""
NAME_WIDTH = 20
VALUE_WIDTH = 11
"""Room for the widest value, "1023.99 GiB" (a 141 GB card shows 131.03 GiB): columns never touch."""
PREDICTED_WIDTH = 12
LOGITS_SHOWN_FROM_BYTES = 1 << 20
FAILURE_MOMENT_NOTE = "each column: one moment, the failing allocation"
"""The moment after an out-of-memory failure: the bands are those of the allocation that failed."""


BAND_COLOURS_CSS = """
        & > .memory-bar--cuda-context { color: $secondary; }
        & > .memory-bar--weights { color: $primary; }
        & > .memory-bar--gradients { color: $success; }
        & > .memory-bar--optimizer-state { color: $warning; }
        & > .memory-bar--activations { color: $error; }
        & > .memory-bar--temporaries-and-cache { color: $error-lighten-2; }
        &:ansi > .memory-bar--temporaries-and-cache { color: ansi_magenta; }"""
"""The bands' colours (the theme's), shared by every widget that draws bands: the bar and the anatomy timeline."""


def band_component_class(band: str) -> str:
    """The component class of a band: weights_bytes -> memory-bar--weights."""
    return "memory-bar--" + band.removesuffix("_bytes").replace("_", "-")


def split_cells(values: Sequence[int], scale: int, width: int) -> list[int]:
    """Bar cells per value, proportional to value/scale by largest remainders.

    A non-zero value gets at least one cell (taken from the widest) so no band disappears.
    """
    if scale <= 0 or width <= 0:
        return [0] * len(values)
    exact = [max(0, value) * width / scale for value in values]
    cells = [int(share) for share in exact]
    target = min(width, round(sum(exact)))
    by_remainder = sorted(range(len(values)), key=lambda index: exact[index] - cells[index], reverse=True)
    for index in by_remainder[: max(0, target - sum(cells))]:
        cells[index] += 1
    for index, value in enumerate(values):
        if value > 0 and cells[index] == 0:
            widest = max(range(len(cells)), key=cells.__getitem__)
            if cells[widest] > 1:
                cells[widest] -= 1
                cells[index] = 1
    return cells


class MemoryBar(CachedRows):
    """Measured (and optionally predicted) memory bands as stacked bars with a legend."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        *(band_component_class(band) for band in BAND_NAMES),
        "memory-bar--label",
        "memory-bar--header",
        "memory-bar--value",
        "memory-bar--reason",
        "memory-bar--overflow",
        "memory-bar--unattributed",
        LOGITS_COMPONENT,
    }

    DEFAULT_CSS = (
        """
    MemoryBar {
        height: auto;
        & > .memory-bar--other-processes { color: $text-muted; }"""
        + BAND_COLOURS_CSS
        + """
        & > .memory-bar--free { color: $text-disabled; }
        & > .memory-bar--label { color: $text-muted; }
        & > .memory-bar--header { color: $text-muted; text-style: bold; }
        & > .memory-bar--value { color: $text; }
        & > .memory-bar--reason { color: $text-muted; text-style: italic; }
        & > .memory-bar--overflow { color: $error; text-style: bold; }
        & > .memory-bar--unattributed { color: $accent; }
        & > .memory-bar--logits { color: $error-darken-2; }
        &:ansi > .memory-bar--other-processes { color: ansi_bright_black; }
        &:ansi > .memory-bar--logits { color: ansi_red; }
        &:ansi > .memory-bar--free { color: ansi_bright_black; }
        &:ansi > .memory-bar--label { color: ansi_bright_black; }
        &:ansi > .memory-bar--header { color: ansi_bright_black; }
        &:ansi > .memory-bar--reason { color: ansi_bright_black; }
    }
    """
    )

    def __init__(
        self,
        *,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
        disabled: bool = False,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes, disabled=disabled)
        self._current: dict[str, int | None] = dict.fromkeys(BAND_NAMES)
        self._peak: dict[str, int | None] = dict.fromkeys(BAND_NAMES)
        self._predicted: dict[str, int | None] | None = None
        self._total_bytes: int | None = None
        self._predicted_total_bytes: int | None = None
        self._unavailable: dict[str, str] = {}
        self._unattributed_bytes: int | None = None
        self._has_reading = False
        self._version = 0
        self._legend = True
        self._moment_note = MOMENT_NOTE
        self._logits: tuple[int | None, int | None, int | None] = (None, None, None)
        """(now, peak, predicted) bytes of a causal LM's logits, shown under the activations they are part of."""
        self._trainable: tuple[int | None, int | None] = (None, None)
        """(measured, predicted) bytes of the weights that train, where some are frozen (LoRA, QLoRA)."""
        self._gradients_after_backward: tuple[int | None, int | None] = (None, None)
        """(measured, predicted) bytes of the gradients after backward: another moment than the bars', said beside
        the gradients band (which holds those alive at the end of forward)."""

    @property
    def current(self) -> Mapping[str, int | None]:
        """The measured bands shown (band name -> bytes; None: not measured)."""
        return self._current

    @property
    def logits(self) -> tuple[int | None, int | None, int | None]:
        return self._logits

    def update_logits(self, now: int | None, peak: int | None, predicted: int | None) -> None:
        """A causal LM's logits (part of the activations): a band of their own, carved out of the activations in both
        bars, and a legend row under the activations, once one of the values reaches a MiB (a classifier's 2-label
        logits never do)."""
        if (now, peak, predicted) != self._logits:
            layout = self._shows_logits() != self._shows_logits((now, peak, predicted))
            self._logits = (now, peak, predicted)
            self._changed(layout=layout)

    @property
    def trainable(self) -> tuple[int | None, int | None]:
        return self._trainable

    def update_trainable(self, measured: int | None, predicted: int | None) -> None:
        """The weights that train where the rest is frozen (LoRA's adapters): a row under the weights; None, None
        (full fine-tuning) shows none."""
        if (measured, predicted) != self._trainable:
            layout = self._shows_trainable() != (measured is not None or predicted is not None)
            self._trainable = (measured, predicted)
            self._changed(layout=layout)

    def update_gradients_after_backward(self, measured: int | None, predicted: int | None) -> None:
        """The gradients' size after backward, measured and predicted: a note on the gradients row, not a band."""
        if (measured, predicted) != self._gradients_after_backward:
            self._gradients_after_backward = (measured, predicted)
            self._changed(layout=False)

    def _shows_trainable(self) -> bool:
        return any(value is not None for value in self._trainable)

    def _shows_logits(self, logits: tuple[int | None, int | None, int | None] | None = None) -> bool:
        return any((value or 0) >= LOGITS_SHOWN_FROM_BYTES for value in (logits or self._logits))

    def show_moment(self, at_failure: bool) -> None:
        """Say beside the header which moment the columns are: a forward pass's end, or the failing allocation."""
        note = FAILURE_MOMENT_NOTE if at_failure else MOMENT_NOTE
        if note != self._moment_note:
            self._moment_note = note
            self._changed(layout=False)

    def show_legend(self, shown: bool) -> None:
        """Show the legend (a row per band) or only the bars and the device-used row: a short terminal that shows a
        lane per GPU has no rows to spare for it."""
        if shown != self._legend:
            self._legend = shown
            self._changed(layout=True)

    def update_bands(
        self,
        current: Mapping[str, int | None],
        peak: Mapping[str, int | None] | None,
        total_bytes: int | None,
        unavailable: Mapping[str, str],
        unattributed_bytes: int | None = None,
    ) -> None:
        """Show a measurement: band name -> bytes (None: not measured, why in `unavailable`);
        `unattributed_bytes`: a watched process's GPU memory that no band accounts for (no probe).

        Calling it again with the same values costs nothing: the app may call it at every paint tick.
        """
        measurement = (
            {band: current.get(band) for band in BAND_NAMES},
            {band: (peak or {}).get(band) for band in BAND_NAMES},
            total_bytes,
            dict(unavailable),
            unattributed_bytes,
        )
        if self._has_reading and measurement == (
            self._current,
            self._peak,
            self._total_bytes,
            self._unavailable,
            self._unattributed_bytes,
        ):
            return
        layout = (unattributed_bytes is None) != (self._unattributed_bytes is None)
        self._current, self._peak, self._total_bytes, self._unavailable, self._unattributed_bytes = measurement
        self._has_reading = True
        self.tooltip = (
            "\n".join(
                f"{BAND_LABELS[band]}: {reason}" for band, reason in self._unavailable.items() if band in BAND_LABELS
            )
            or None
        )
        self._changed(layout=layout)

    def update_predicted(self, predicted: Mapping[str, int | None] | None, total_bytes: int | None = None) -> None:
        """Show the prediction for the configured run as a second bar and column; None removes it.

        `total_bytes` (the device total) scales the bars until a measurement brings its own.
        """
        bands = None if predicted is None else {band: predicted.get(band) for band in BAND_NAMES}
        if (bands, total_bytes) == (self._predicted, self._predicted_total_bytes):
            return
        had_prediction = self._predicted is not None
        self._predicted, self._predicted_total_bytes = bands, total_bytes
        self._changed(layout=had_prediction != (bands is not None))

    def _changed(self, layout: bool) -> None:
        self._version += 1
        self.repaint_changes(layout=layout)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        bars = 2 if self._predicted is not None else 1
        if not self._legend:
            return bars + 1
        return (
            bars
            + 1
            + len(BAND_NAMES)
            + (self._unattributed_bytes is not None)
            + self._shows_logits()
            + self._shows_trainable()
            + 1
        )

    def rows_key(self) -> int:
        return self._version

    def build_rows(self, width: int, height: int) -> list[Strip]:
        return self._build_rows(width)

    def _style(self, component: str) -> Style:
        return self.component_style(component)

    def _finish(self, segments: list[Segment], width: int) -> Strip:
        return Strip(segments).adjust_cell_length(width, self._base_style)

    @property
    def _device_total_bytes(self) -> int | None:
        return self._total_bytes if self._total_bytes is not None else self._predicted_total_bytes

    def _scale_bytes(self) -> int:
        sums = [sum(value or 0 for value in bands.values()) for bands in (self._current, self._predicted) if bands]
        return max([self._device_total_bytes or 0, *sums]) + (self._unattributed_bytes or 0) * (
            self._device_total_bytes is None
        )

    def _why_no_bar(self, bands: Mapping[str, int | None]) -> str:
        """What the measured row says while it has nothing to draw: that no GPU reading can come (no NVML), with
        the reason, rather than waiting for one forever; else that it waits."""
        if bands is self._current:
            for reason in self._unavailable.values():
                if reason.startswith(NO_GPU_READINGS):
                    return printable(reason)
        return "waiting for a reading…"

    def _bar_row(self, label: str, bands: Mapping[str, int | None], width: int) -> Strip:
        segments = [Segment(f"{label:<{LABEL_WIDTH}}", self._style("memory-bar--label"))]
        bar_width = max(0, width - LABEL_WIDTH)
        scale = self._scale_bytes()
        if scale <= 0:
            segments.append(Segment(self._why_no_bar(bands), self._style("memory-bar--reason")))
            return self._finish(segments, width)
        unattributed = self._unattributed_bytes if bands is self._current else None
        logits = (self._logits[0] if bands is self._current else self._logits[2]) if self._shows_logits() else None
        activations = bands.get("activations_bytes") or 0
        logits = min(logits or 0, activations)
        names = [*BAND_NAMES[:-1], "unattributed", BAND_NAMES[-1]]
        names.insert(names.index("activations_bytes") + 1, "logits")
        values = [
            (unattributed or 0)
            if name == "unattributed"
            else logits
            if name == "logits"
            else activations - logits
            if name == "activations_bytes"
            else bands.get(name) or 0
            for name in names
        ]
        cells = split_cells(values, scale, bar_width)
        special = {
            "unattributed": (UNATTRIBUTED_GLYPH, "memory-bar--unattributed"),
            "logits": (LOGITS_GLYPH, LOGITS_COMPONENT),
        }
        for name, count in zip(names, cells, strict=True):
            if count:
                glyph, component = special.get(name) or (BAND_GLYPHS[name], band_component_class(name))
                segments.append(Segment(glyph * count, self._style(component)))
        return self._finish(segments, width)

    def _build_rows(self, width: int) -> list[Strip]:
        if width <= 0:
            return []
        rows = [self._bar_row("measured", self._current if self._has_reading else {}, width)]
        if self._predicted is not None:
            rows.append(self._bar_row("predicted", self._predicted, width))
        if not self._legend:
            return [*rows, self._used_row(width)]
        predicted_header = f"{'predicted':>{PREDICTED_WIDTH}}" if self._predicted is not None else ""
        header = f"{'':3}{'band':<{NAME_WIDTH}}{'now':>{VALUE_WIDTH}}{'peak':>{VALUE_WIDTH}}{predicted_header}"
        header_segments = [Segment(header, self._style("memory-bar--header"))]
        if width - len(header) >= len(self._moment_note) + 2:  # the moment every column is of, where it fits
            header_segments.append(Segment(f"  {self._moment_note}", self._style("memory-bar--reason")))
        rows.append(self._finish(header_segments, width))
        for band in BAND_NAMES[:-1]:
            rows.append(self._band_row(band, width))
            if band == "activations_bytes" and self._shows_logits():
                rows.append(self._logits_row(width))
            if band == "weights_bytes" and self._shows_trainable():
                rows.append(self._trainable_row(width))
        if self._unattributed_bytes is not None:
            rows.append(self._unattributed_row(width))
        rows.append(self._band_row(BAND_NAMES[-1], width))
        rows.append(self._used_row(width))
        return rows

    def _unattributed_row(self, width: int) -> Strip:
        value_style = self._style("memory-bar--value")
        segments = [
            Segment(UNATTRIBUTED_GLYPH * 2, self._style("memory-bar--unattributed")),
            Segment(f" {UNATTRIBUTED_LABEL:<{NAME_WIDTH}}", value_style),
            Segment(f"{format_bytes(self._unattributed_bytes):>{VALUE_WIDTH}}", value_style),
        ]
        reason = "not broken down: the process publishes no anatomy"
        room = width - sum(len(segment.text) for segment in segments) - 2
        if room > 1:
            shown = reason if len(reason) <= room else reason[: room - 1] + "…"
            segments.append(Segment(f"  {shown}", self._style("memory-bar--reason")))
        return self._finish(segments, width)

    def _values_text(self, now: int | None, peak: int | None, predicted: int | None) -> str:
        text = f"{format_bytes(now):>{VALUE_WIDTH}}{format_bytes(peak):>{VALUE_WIDTH}}"
        if self._predicted is not None:
            text += f"{format_bytes(predicted):>{PREDICTED_WIDTH}}"
        return text

    def _band_row(self, band: str, width: int) -> Strip:
        value_style = self._style("memory-bar--value")
        now, peak = self._current[band], self._peak[band]
        predicted = self._predicted.get(band) if self._predicted is not None else None
        reason = printable(self._unavailable.get(band) or "") if now is None else None
        segments = [
            Segment(BAND_GLYPHS[band] * 2, self._style(band_component_class(band))),
            Segment(f" {BAND_LABELS[band]:<{NAME_WIDTH}}", value_style),
        ]
        if reason and peak is None and predicted is None:
            # Nothing to show right of "now": the reason takes the empty columns.
            segments.append(Segment(f"{format_bytes(None):>{VALUE_WIDTH}}", value_style))
        else:
            segments.append(Segment(self._values_text(now, peak, predicted), value_style))
        room = width - sum(len(segment.text) for segment in segments) - 2
        if band == "gradients_bytes" and not reason:
            reason = self._after_backward_note()
        if reason and room > 1:
            shown = reason if len(reason) <= room else reason[: room - 1] + "…"
            segments.append(Segment(f"  {shown}", self._style("memory-bar--reason")))
        return self._finish(segments, width)

    def _after_backward_note(self) -> str | None:
        """ "after backward 1.25 GiB": the gradients' size then, measured, else predicted."""
        measured, predicted = self._gradients_after_backward
        if measured is not None:
            return f"after backward {format_bytes(measured)}"
        if predicted is not None:
            return f"after backward {format_bytes(predicted)} (predicted)"
        return None

    def _logits_row(self, width: int) -> Strip:
        now, peak, predicted = self._logits
        return self._finish(
            [
                Segment(f"  {LOGITS_GLYPH}", self._style(LOGITS_COMPONENT)),
                Segment(
                    f"{'  of which logits':<{NAME_WIDTH}}{self._values_text(now, peak, predicted)}",
                    self._style("memory-bar--label"),
                ),
            ],
            width,
        )

    def _trainable_row(self, width: int) -> Strip:
        measured, predicted = self._trainable
        text = f"{'':3}{'  of which trainable':<{NAME_WIDTH}}{self._values_text(measured, measured, predicted)}"
        return self._finish([Segment(text, self._style("memory-bar--label"))], width)

    def _used_row(self, width: int) -> Strip:
        def device_used(bands: Mapping[str, int | None] | None) -> tuple[int | None, str]:
            """Sum of the bands other than free, and its text: "≥" when some band is unknown."""
            values = [bands.get(band) for band in BAND_NAMES if band != "free_bytes"] if bands else []
            known = [value for value in values if value is not None]
            if not known:
                return None, format_bytes(None)
            prefix = "≥" if len(known) < len(values) else ""
            return sum(known), prefix + format_bytes(sum(known))

        now, now_text = device_used(self._current if self._has_reading else None)
        if self._unattributed_bytes is not None and now is not None:
            # the watched process's memory stands for every band of its own: the sum is complete
            now_text = format_bytes(now + self._unattributed_bytes)
        predicted, predicted_text = device_used(self._predicted)
        text = f"   {'device used':<{NAME_WIDTH}}{now_text:>{VALUE_WIDTH}}{'':>{VALUE_WIDTH}}"
        if self._predicted is not None:
            text += f"{predicted_text:>{PREDICTED_WIDTH}}"
        segments = [Segment(text, self._style("memory-bar--value"))]
        total_bytes = self._device_total_bytes
        if total_bytes is not None:
            segments.append(Segment(f"  of {format_bytes(total_bytes)}", self._style("memory-bar--label")))
            if predicted is not None and predicted > total_bytes:
                segments.append(Segment("  predicted does not fit", self._style("memory-bar--overflow")))
        return self._finish(segments, width)
