"""The watched process: its command, whether it publishes its anatomy, its process tree (CPU, RSS, GPU memory
per process), the device's other processes, and what NVML's PIDs mean here (PID namespaces)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from rich.text import Text
from textual.strip import Strip

from gpuanat.core.measure.watch import NOT_PUBLISHED
from gpuanat.core.store.report import format_bytes
from gpuanat.tui.widgets.cached_rows import CachedRows, text_height, text_rows

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

    def show(self, record: dict[str, Any] | None, command: str) -> None:
        if (record, command) != (self._record, self._command):
            self._record, self._command = record, command
            self._version += 1
            width = self.size.width
            resized = not width or text_height(self, self.render(), width) != self.size.height
            self.repaint_changes(layout=resized)

    def rows_key(self) -> Hashable:
        return self._version

    def build_rows(self, width: int, height: int) -> list[Strip]:
        return text_rows(self, self.render(), width, height)

    def render(self) -> Text:
        heading = self.get_component_rich_style("process-panel--heading")
        muted = self.get_component_rich_style("process-panel--muted")
        good = self.get_component_rich_style("process-panel--good")
        warning = self.get_component_rich_style("process-panel--warning")
        text = Text(no_wrap=False, overflow="ellipsis")
        text.append(self._command or "…", style=muted)
        record = self._record
        if record is None:
            text.append("\nwaiting for the first sample…", style=muted)
            return text
        text.append("\n")
        if record.get("exited"):
            text.append("the process has exited\n", style=warning)
        elif record["published"]:
            text.append(f"anatomy published by PID {record['publisher_pid']}\n", style=good)
        elif record["publication_reason"] == NOT_PUBLISHED:
            text.append("anatomy not published (no AnatomyCallback)\n", style=muted)
        else:
            text.append(f"{record['publication_reason']}\n", style=muted)
        scope = record.get("gpu_util_scope")
        if scope is not None:
            text.append("GPU util: " + ("per process" if scope == "process" else "whole device") + "\n", style=muted)
        text.append(f"\n{'PID':>7} {'process':<11}{'CPU%':>5}{'RSS':>9}{'GPU':>9}\n", style=heading)
        rows = _tree_order(record.get("processes") or [], record["pid"])
        for depth, process in rows[:MAX_TREE_ROWS]:
            name = ("  " * min(depth, 3) + process["name"])[:11]
            gpu = process.get("gpu_memory_bytes")
            text.append(f"{process['pid']:>7} {name:<11}{process['cpu_percent']:>5.0f}"
                        f"{format_bytes(process['rss_bytes']):>9}{format_bytes(gpu) if gpu else '':>9}\n")
        if len(rows) > MAX_TREE_ROWS:
            text.append(f"  … {len(rows) - MAX_TREE_ROWS} more\n", style=muted)
        if record.get("gpu_memory_reason"):
            text.append(f"GPU memory: {record['gpu_memory_reason']}\n", style=muted)
        others = record.get("other_gpu_processes") or []
        text.append("\nother processes on the GPU", style=heading)
        if not record.get("gpus"):  # no NVML reading: whether there are any is unknown, not "none"
            text.append("  unknown (no GPU readings)\n", style=muted)
        elif not others:
            text.append("  none\n", style=muted)
        else:
            text.append("\n")
            for other in others[:MAX_OTHER_ROWS]:
                name = other.get("name") or ("not visible here" if other.get("local_pid") is None else "?")
                text.append(f"{other['pid']:>7} {name[:12]:<12} GPU {other['gpu']} "
                            f"{format_bytes(other['used_bytes']):>9}\n")
            if len(others) > MAX_OTHER_ROWS:
                text.append(f"  … {len(others) - MAX_OTHER_ROWS} more\n", style=muted)
        namespace = record.get("pid_namespace")
        if namespace:
            text.append(f"\n{namespace['note']}\n", style=warning)
        text.rstrip()
        return text
