"""The operations anatomy in the charts' place (`O`): where the profiled steps' GPU time went by kind of operation
— tensor contractions, normalizations, element-wise, the optimizer, memory copies, the rest — each kind's share of
the time as a bar, its share of the FLOPs and its TFLOP/s, beside the paper's BERT-large shares (Ivanov et al.).
Before a run has been profiled it says how to profile one. Rows laid out for the width it has: the paper's columns
and TFLOP/s go first when narrow. Kernel names come from the user's code: shown through `printable`."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from rich.text import Text
from textual.strip import Strip

from gpuanat.core.operations.anatomy import PAPER_SOURCE, table_rows
from gpuanat.core.operations.classify import GROUPS, kernel_function
from gpuanat.core.operations.report import heading, percent, rate
from gpuanat.core.printable import printable
from gpuanat.tui.widgets.cached_rows import CachedRows, text_rows

BAR_CELLS = 12
"""A kind's share of the profiled time: a cell is about 8%."""
WIDE_COLUMNS = 72
"""From this width the rows have the bar, TFLOP/s and the paper's FLOP share too."""
SHORT_LABELS = {
    "contractions": "contractions",
    "normalizations": "normalizations",
    "elementwise": "element-wise",
    "optimizer": "optimizer",
    "memory_copies": "memory copies",
    "other": "other",
}


class OperationsPanel(CachedRows):
    COMPONENT_CLASSES = {
        "operations-panel--muted",
        "operations-panel--title",
        *(f"operations-panel--{group.replace('_', '-')}" for group in GROUPS),
    }
    DEFAULT_CSS = """
    OperationsPanel { height: 1fr; padding: 0 1; color: $text; }
    OperationsPanel > .operations-panel--muted { color: $text-muted; }
    OperationsPanel > .operations-panel--title { text-style: bold; }
    OperationsPanel > .operations-panel--contractions { color: $primary; }
    OperationsPanel > .operations-panel--normalizations { color: $warning; }
    OperationsPanel > .operations-panel--elementwise { color: $error; }
    OperationsPanel > .operations-panel--optimizer { color: $accent; }
    OperationsPanel > .operations-panel--memory-copies { color: $secondary; }
    OperationsPanel > .operations-panel--other { color: $text-muted; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._anatomy: Mapping[str, Any] | None = None
        self._run_id: int | None = None
        self._note = ""

    def show(self, anatomy: Mapping[str, Any] | None, run_id: int | None, note: str) -> None:
        """The anatomy of run `run_id` (None: none profiled yet; a watched run has no id) and a last line, `note`:
        how to profile (the next) one."""
        if (anatomy, run_id, note) != (self._anatomy, self._run_id, self._note):
            self._anatomy, self._run_id, self._note = anatomy, run_id, note
            self.repaint_changes()

    def rows_key(self) -> Hashable:
        return (id(self._anatomy), self._run_id, self._note)

    def build_rows(self, width: int, height: int) -> list[Strip]:
        return text_rows(self, self.render_text(width - 2), width, height)

    def render_text(self, width: int) -> Text:
        muted = self.component_style("operations-panel--muted")
        if self._anatomy is None:
            return Text.assemble(
                ("Operations anatomy", self.component_style("operations-panel--title")),
                "\n",
                (
                    f"{self._note} Where the GPU time goes by kind of operation — tensor contractions, "
                    "normalizations, element-wise — beside the paper's BERT-large table.",
                    muted,
                ),
            )
        wide = width >= WIDE_COLUMNS
        text = Text(
            "Operations" + (f" of run {self._run_id}" if self._run_id is not None else "") + ": ",
            style=self.component_style("operations-panel--title"),
        )
        text.append(heading(self._anatomy).removeprefix("Operations: "), style=muted)
        text.append("\n")
        header = f"{'kind':<15}" + (" " * (BAR_CELLS + 1) if wide else "") + f"{'time':>6} {'FLOPs':>7}"
        header += f" {'TFLOP/s':>8} │ {'paper':>6} {'FLOPs':>7}" if wide else f" │ {'paper':>6}"
        text.append(header + "\n", style=muted)
        for row in table_rows(self._anatomy):
            style = self.component_style(f"operations-panel--{row['group'].replace('_', '-')}")
            text.append(f"{SHORT_LABELS[row['group']]:<15}", style=style)
            if wide:
                cells = round(BAR_CELLS * (row["time_share"] or 0))
                text.append("█" * cells, style=style)
                text.append(" " * (BAR_CELLS - cells + 1))
            text.append(f"{percent(row['time_share']):>6} {percent(row['flop_share'], 2):>7}")
            if wide:
                text.append(f" {rate(row['tflops_per_s']):>8}")
            text.append(" │ ", style=muted)
            text.append(f"{percent(row['paper_time_share']):>6}", style=muted)
            if wide:
                text.append(f" {percent(row['paper_flop_share'], 2):>7}", style=muted)
            text.append("\n")
        longest = longest_kernel(self._anatomy)
        if longest is not None:
            text.append(f"longest kernel: {printable(kernel_function(longest))}", style=muted)
            text.append("\n")
        text.append(f"paper: {PAPER_SOURCE}. {self._note}", style=muted)
        return text


def longest_kernel(anatomy: Mapping[str, Any]) -> str | None:
    """The name of the kernel that took the most time, of every group's top ones."""
    tops = [
        kernel
        for group in GROUPS
        if isinstance(anatomy.get(group), Mapping)
        for kernel in (anatomy[group].get("top_kernels") or [])[:1]
        if isinstance(kernel, Mapping)
    ]
    return max(tops, key=lambda kernel: kernel.get("time_s") or 0).get("name") if tops else None
