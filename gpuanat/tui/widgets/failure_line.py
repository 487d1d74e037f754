"""Above the memory bar when the run shown ran out of memory: what failed — the phase, the module and the operation
that asked, the step, the allocation tried and what the device had free — and the largest live tensor then; the bar
under it shows the memory at that moment. Hidden while the run shown did not run out of memory.

It reads the failure as a result's `out_of_memory` has it (`gpuanat.core.measure.failure.out_of_memory_json`), so a
run in progress, a finished one and a watched one say it alike. Module paths, operations and dtypes come from the
user's code: shown through `printable`, as text, never markup. Where the sentence does not fit its rows (two at
80×24), the operation is shortened first, then left out, then the largest tensor's shape."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from rich.text import Text
from textual.geometry import Size
from textual.strip import Strip

from gpuanat.core.measure.failure import PHASE_WORDS
from gpuanat.core.printable import printable
from gpuanat.core.store.report import format_bytes
from gpuanat.tui.widgets.cached_rows import CachedRows, text_height, text_rows

ROWS_AT_MOST = 3
"""The rows the line may take; the compact layout of short terminals gives it two (`max_rows`)."""


def out_of_memory_sentence(failure: Mapping[str, Any], operation: str | None = None) -> str:
    """ "out of memory in the forward of bert.encoder.layer.10.output.dense (hidden_states = …), step 1: tried 768 MiB,
    589 MiB free", from a result's `out_of_memory`; `operation` in place of the failure's own (a shortened one, ""
    for none). Not yet made printable: the module and the operation are the user's code."""
    phase = failure.get("phase")
    text = "out of memory" + (f" {PHASE_WORDS.get(phase, f'in {phase}')}" if phase else "")
    if failure.get("module"):
        text += (" of " if phase in ("forward", "backward") else " in ") + failure["module"]
    operation = failure.get("operation") if operation is None else operation
    if operation:
        text += f" ({operation})"
    if failure.get("step") is not None:
        text += f", step {failure['step']}"
    tried, free = failure.get("failed_allocation_bytes"), failure.get("device_free_bytes")
    figures = ([f"tried {format_bytes(tried)}"] if tried is not None else []) + (
        [f"{format_bytes(free)} free"] if free is not None else []
    )
    return text + (": " + ", ".join(figures) if figures else "")


def largest_tensor_sentence(failure: Mapping[str, Any], *, shape: bool = True) -> str | None:
    """ "largest tensor: activations of bert.encoder.layer.0.output.dense, 3.00 GiB float32 [196608, 4096]"; None
    when the failure lists no tensors."""
    tensors = failure.get("largest_tensors") or []
    if not tensors:
        return None
    tensor = tensors[0]
    text = f"largest tensor: {tensor.get('band')}"
    if tensor.get("module"):
        text += f" of {tensor['module']}"
    text += f", {format_bytes(tensor.get('bytes'))}"
    if shape:
        text += f" {tensor.get('dtype')} {list(tensor.get('shape') or [])}"
    return text


class FailureLine(CachedRows):
    COMPONENT_CLASSES = {"failure-line--what", "failure-line--muted"}
    DEFAULT_CSS = """
    FailureLine { height: auto; padding: 0 1; color: $text; }
    FailureLine > .failure-line--what { color: $error; text-style: bold; }
    FailureLine > .failure-line--muted { color: $text-muted; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._failure: Mapping[str, Any] | None = None
        self._run_id: int | None = None
        self._max_rows = ROWS_AT_MOST
        self.display = False

    @property
    def failure(self) -> Mapping[str, Any] | None:
        """The failure shown (a result's `out_of_memory`), None while hidden."""
        return self._failure

    def show(self, failure: Mapping[str, Any] | None, run_id: int | None = None) -> None:
        """The out-of-memory failure of run `run_id` (a watched run has none); None hides the line."""
        if (failure, run_id) == (self._failure, self._run_id):
            return
        self._failure, self._run_id = failure, run_id
        self.display = failure is not None
        self.repaint_changes(layout=True)  # its rows come and go with it

    @property
    def max_rows(self) -> int:
        return self._max_rows

    @max_rows.setter
    def max_rows(self, rows: int) -> None:
        """The rows it may take: fewer in the compact layout, where the charts have little room left."""
        if rows != self._max_rows:
            self._max_rows = rows
            self.repaint_changes(layout=True)

    def rows_key(self) -> Hashable:
        return (id(self._failure), self._run_id, self._max_rows)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if self._failure is None:
            return 0
        return min(self._max_rows, text_height(self, self.fitted(width), width))

    def build_rows(self, width: int, height: int) -> list[Strip]:
        return text_rows(self, self.fitted(width), width, height)

    def fitted(self, width: int) -> Text:
        """The line within `max_rows` rows of `width` cells: whole where it fits, else the operation shortened, then
        left out, then the largest tensor's shape, then the note on the bar, then the largest tensor."""
        failure = self._failure
        if failure is None:
            return Text("")
        operation = str(failure.get("operation") or "")
        text = self._text(operation)
        while not self._fits(text, width) and len(operation) > 1:
            over = text.cell_len - self._max_rows * width + width // 2  # a wrapped row ends before its last cell
            operation = operation[: max(0, len(operation) - max(over, 8) - 1)].rstrip()
            text = self._text(operation + "…" if operation else "")
        for shape, note, largest in ((False, True, True), (False, False, True), (False, False, False)):
            if self._fits(text, width):
                break
            text = self._text("", shape=shape, note=note, largest=largest)
        return text

    def _fits(self, text: Text, width: int) -> bool:
        return text_height(self, text, width) <= self._max_rows

    def _text(self, operation: str, *, shape: bool = True, note: bool = True, largest: bool = True) -> Text:
        failure = self._failure
        assert failure is not None
        muted = self.component_style("failure-line--muted")
        text = Text("✗ " + (f"run {self._run_id}: " if self._run_id is not None else ""), style=muted)
        what = self.component_style("failure-line--what")
        text.append(printable(out_of_memory_sentence(failure, operation)), style=what)
        tensor = largest_tensor_sentence(failure, shape=shape) if largest else None
        if tensor is not None:
            text.append(f" · {printable(tensor)}", style=muted)
        if note:
            text.append(" · the bar: memory at that moment", style=muted)
        return text
