"""The watched process: its command, whether it publishes its anatomy, its process tree (CPU, RSS, GPU memory
per process), the device's other processes, and what NVML's PIDs mean here (PID namespaces)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from rich.text import Span, Text
from textual.strip import Strip

from gpuanat.core.printable import printable
from gpuanat.core.store.report import format_bytes
from gpuanat.tui.widgets.cached_rows import CachedRows, text_height, text_line_row, text_rows

LineKey = tuple[int, str, tuple[Span, ...]]
"""A line of text as drawn: its place in the text, its characters and its styled spans."""
MAX_TREE_ROWS = 12
MAX_OTHER_ROWS = 6


def _tree_order(processes: list[dict[str, Any]], root_pid: int) -> list[tuple[int, dict[str, Any]]]:
    """(depth, process) with each process under its parent, the watched process first."""
    by_parent: dict[int | None, list[dict[str, Any]]] = {}
    for process in processes:
        by_parent.setdefault(process["parent_pid"], []).append(process)
    ordered: list[tuple[int, dict[str, Any]]] = []
    roots = [process for process in processes if process["pid"] == root_pid]
    stack = [(0, process) for process in reversed(roots)]
    seen: set[int] = set()
    while stack:
        depth, process = stack.pop()
        if process["pid"] in seen:
            continue
        seen.add(process["pid"])
        ordered.append((depth, process))
        children = sorted(by_parent.get(process["pid"], []), key=lambda child: child["pid"], reverse=True)
        stack.extend((depth + 1, child) for child in children)
    ordered.extend((1, process) for process in processes if process["pid"] not in seen)
    return ordered


class ProcessPanel(CachedRows):
    """Shows the latest watch record; the app calls `show` at its paint tick, and the cells that changed (a CPU
    figure, an RSS) are repainted."""

    COMPONENT_CLASSES = {
        "process-panel--heading",
        "process-panel--muted",
        "process-panel--good",
        "process-panel--warning",
    }
    DEFAULT_CSS = """
    ProcessPanel {
        height: auto;
        padding: 0 1;
        border: round $primary;
        border-title-color: $text;
    }
    ProcessPanel > .process-panel--heading { color: $text; text-style: bold; }
    ProcessPanel > .process-panel--muted { color: $text-muted; }
    ProcessPanel > .process-panel--good { color: $success; }
    ProcessPanel > .process-panel--warning { color: $warning; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "watched process"
        self._command = ""
        self._record: dict[str, Any] | None = None
        self._version = 0
        self._text: Text | None = None
        """What `render` made of the record shown (None: not rendered since the styles changed)."""
        self._text_lines: list[Text] = []
        """`_text` line by line."""
        self._line_rows: dict[LineKey, list[Strip]] = {}
        """The rows of each line of `_text`, at `_line_rows_width`: a new record re-renders only its changed lines."""
        self._line_rows_width = 0
        self._line_heights: dict[str, int] = {}
        """The rows each line of `_text` takes at `_line_rows_width` (its wrapping depends on its characters)."""

    def show(self, record: dict[str, Any] | None, command: str) -> None:
        """Show `record`: at each sample a figure or two of the tree change, so the text is rendered once, only its
        changed lines are made into rows, and the layout is redone only when the panel's height changes."""
        if (record, command) == (self._record, self._command):
            return
        self._record, self._command = record, command
        text = self.render()
        if text == self._text:  # the same on screen (a figure that moved by less than it shows)
            return
        self._text, self._text_lines = text, list(text.split("\n", allow_blank=True))
        self._version += 1
        width = self.size.width
        resized = not width or self._height(width) != self.size.height
        self.repaint_changes(layout=resized)

    def rows_key(self) -> Hashable:
        return self._version

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._text = None  # rendered in the old colours
        self._line_rows = {}

    def _lines(self, width: int) -> list[Text]:
        if width != self._line_rows_width:
            self._line_rows, self._line_heights, self._line_rows_width = {}, {}, width
        if self._text is None:
            self._text = self.render()
            self._text_lines = list(self._text.split("\n", allow_blank=True))
        return self._text_lines

    def _height(self, width: int) -> int:
        """The rows the text takes at `width`, as Textual's layout counts them: each line wraps on its own, and one
        that fits takes one row."""
        heights: dict[str, int] = {}
        total = 0
        for line in self._lines(width):
            height = heights.get(line.plain) or self._line_heights.get(line.plain)
            if height is None:
                height = 1 if line.cell_len <= width else text_height(self, line, width)
            heights[line.plain] = height
            total += height
        self._line_heights = heights
        return total

    def build_rows(self, width: int, height: int) -> list[Strip]:
        if self.text_selection is not None:  # a selection is drawn across lines: the text whole
            return text_rows(self, self._text or self.render(), width, height)
        rows: list[Strip] = []
        line_rows: dict[LineKey, list[Strip]] = {}
        for y, line in enumerate(self._lines(width)):
            key = (y, line.plain, tuple(line.spans))
            strips = self._line_rows.get(key)
            if strips is None and line.cell_len <= width:
                strips = [text_line_row(self, line, width, y)]
            elif strips is None:
                # Wrapped, after y blank lines: its rows carry its place in the text (the offsets in their styles by
                # which Textual maps the mouse to a selection), as in the whole text's rows.
                strips = text_rows(self, Text("\n" * y) + line, width, None)[y:]
            line_rows[key] = strips
            rows.extend(strips)
        self._line_rows = line_rows
        return rows[:height]

    def render(self) -> Text:
        heading = self.component_style("process-panel--heading")
        muted = self.component_style("process-panel--muted")
        good = self.component_style("process-panel--good")
        warning = self.component_style("process-panel--warning")
        text = Text(no_wrap=False, overflow="ellipsis")
        text.append(printable(self._command or "…"), style=muted)
        record = self._record
        if record is None:
            text.append("\nwaiting for the first sample…", style=muted)
            return text
        text.append("\n")
        if record.get("exited"):
            text.append("the process has exited\n", style=warning)
        elif record["published"]:
            text.append(f"anatomy published by PID {record['publisher_pid']}\n", style=good)
        elif record.get("probe_hint"):  # which probe the script needs, or that it is starting
            text.append(f"{printable(record['probe_hint']['short'])}\n", style=muted)
        else:
            text.append(f"{printable(record['publication_reason'])}\n", style=muted)
        scope = record.get("gpu_util_scope")
        if scope is not None:
            text.append("GPU util: " + ("per process" if scope == "process" else "whole device") + "\n", style=muted)
        text.append(f"\n{'PID':>7} {'process':<11}{'CPU%':>5}{'RSS':>9}{'GPU':>9}\n", style=heading)
        rows = _tree_order(record.get("processes") or [], record["pid"])
        for depth, process in rows[:MAX_TREE_ROWS]:
            name = ("  " * min(depth, 3) + printable(process["name"]))[:11]
            gpu = process.get("gpu_memory_bytes")
            text.append(
                f"{process['pid']:>7} {name:<11}{process['cpu_percent']:>5.0f}"
                f"{format_bytes(process['rss_bytes']):>9}{format_bytes(gpu) if gpu else '':>9}\n"
            )
        if len(rows) > MAX_TREE_ROWS:
            text.append(f"  … {len(rows) - MAX_TREE_ROWS} more\n", style=muted)
        if record.get("gpu_memory_reason"):
            text.append(f"GPU memory: {printable(record['gpu_memory_reason'])}\n", style=muted)
        others = record.get("other_gpu_processes") or []
        text.append("\nother processes on the GPU", style=heading)
        if not record.get("gpus"):  # no NVML reading: whether there are any is unknown, not "none"
            text.append("  unknown (no GPU readings)\n", style=muted)
        elif not others:
            text.append("  none\n", style=muted)
        else:
            text.append("\n")
            for other in others[:MAX_OTHER_ROWS]:
                name = printable(other.get("name") or ("not visible here" if other.get("local_pid") is None else "?"))
                text.append(
                    f"{other['pid']:>7} {name[:12]:<12} GPU {other['gpu']} {format_bytes(other['used_bytes']):>9}\n"
                )
            if len(others) > MAX_OTHER_ROWS:
                text.append(f"  … {len(others) - MAX_OTHER_ROWS} more\n", style=muted)
        namespace = record.get("pid_namespace")
        if namespace:
            text.append(f"\n{printable(namespace['note'])}\n", style=warning)
        text.rstrip()
        return text
