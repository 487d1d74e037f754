"""One line under the memory bar once a run has timed steps: where its latest steps' time went, phase by phase, and
the bottleneck with the fix to try (gpuanat.core.measure.diagnose, over the last LIVE_WINDOW_STEPS steps); after the
run, the run's own. Hidden while there is none (before the first run, or steps from a probe that does not time them)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from rich.text import Text
from textual.strip import Strip

from gpuanat.core.vocabulary.protocol import STEP_PHASES
from gpuanat.tui.text_fit import fit_words
from gpuanat.tui.widgets.cached_rows import CachedRows, text_rows

BAR_CELLS = 24
"""The stacked bar of the phases: a cell is about 4% of the step."""
PHASE_LABELS = {"data": "data", "forward": "fwd", "backward": "bwd", "optimizer": "opt", "gpu wait": "wait"}


class StepStrip(CachedRows):
    COMPONENT_CLASSES = {
        "step-strip--muted",
        "step-strip--verdict",
        *(f"step-strip--{phase.replace(' ', '-')}" for phase in STEP_PHASES),
    }
    DEFAULT_CSS = """
    StepStrip { height: 1; padding: 0 1; color: $text; }
    StepStrip > .step-strip--muted { color: $text-muted; }
    StepStrip > .step-strip--verdict { color: $warning; text-style: bold; }
    StepStrip > .step-strip--data { color: $error; }
    StepStrip > .step-strip--forward { color: $primary; }
    StepStrip > .step-strip--backward { color: $secondary; }
    StepStrip > .step-strip--optimizer { color: $accent; }
    StepStrip > .step-strip--gpu-wait { color: $text-muted; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: tuple[Any, ...] = ()

    def show(self, breakdown: Mapping[str, Any] | None, finding: Mapping[str, str] | None) -> None:
        """The latest steps' breakdown (`diagnose.recent_breakdown`) and the first finding; None: nothing yet."""
        shown = (
            (None,)
            if breakdown is None
            else (
                round(1000 * breakdown["step_s"]),
                tuple(round(BAR_CELLS * breakdown["share"][phase]) for phase in STEP_PHASES),
                None if breakdown.get("gpu_busy_percent") is None else round(breakdown["gpu_busy_percent"]),
                None if finding is None else (finding["bottleneck"], finding["fix"]),
            )
        )
        self.display = breakdown is not None  # a line of its own only while there is something to show
        if shown != self._shown:  # rounded as shown: a step that moves no figure repaints nothing
            self._shown = shown
            self.repaint_changes()

    def rows_key(self) -> Hashable:
        return self._shown

    def build_rows(self, width: int, height: int) -> list[Strip]:
        return text_rows(self, self.render(max(0, width - 2)), width, height)  # the padding's two cells

    def render(self, width: int | None = None) -> Text:
        """The strip; within `width` cells the fix is cut at a whole word (its remarks in parentheses first)."""
        muted = self.component_style("step-strip--muted")
        if self._shown == (None,) or not self._shown:
            return Text("")
        step_ms, cells, busy, finding = self._shown
        text = Text(f"step {step_ms} ms ", style="bold")
        for phase, count in zip(STEP_PHASES, cells, strict=True):
            text.append("█" * count, style=self.component_style(f"step-strip--{phase.replace(' ', '-')}"))
        text.append(" ")
        for phase, count in zip(STEP_PHASES, cells, strict=True):
            if count:
                text.append(PHASE_LABELS[phase], style=self.component_style(f"step-strip--{phase.replace(' ', '-')}"))
                text.append(" ")
        if busy is not None:
            text.append(f"· GPU busy {busy}% ", style=muted)
        if finding is not None:
            text.append("· ", style=muted)
            text.append(finding[0], style=self.component_style("step-strip--verdict"))
            fix = finding[1] if width is None else fit_words(finding[1], width - text.cell_len - 2)
            if fix:
                text.append(f": {fix}", style=muted)
        return text
