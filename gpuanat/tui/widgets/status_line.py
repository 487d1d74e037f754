"""One line on top: the run's state first (step, elapsed, ETA), then the GPU, the driver and the sampler's own CPU
cost; a banner when NVML is unavailable or a GPU failed ("GPU 1 lost (NVML: GPU is lost)")."""

from __future__ import annotations

from collections.abc import Hashable

from rich.text import Text
from textual.strip import Strip

from gpuanat.core.measure.samples import NvmlStatus
from gpuanat.core.printable import printable
from gpuanat.tui.widgets.cached_rows import CachedRows, text_rows


def gpu_names_text(names: tuple[str, ...]) -> str:
    """The GPUs in few words: "NVIDIA H200" for one, "8× NVIDIA H200" for a box of the same, else each."""
    if not names:
        return "no GPU"
    if len(names) > 1 and len(set(names)) == 1:
        return f"{len(names)}× {names[0]}"
    return ", ".join(names)


class StatusLine(CachedRows):
    COMPONENT_CLASSES = {"status-line--banner", "status-line--muted", "status-line--run"}
    DEFAULT_CSS = """
    StatusLine { height: 1; background: $panel; color: $text; padding: 0 1; }
    StatusLine > .status-line--banner { color: $text; background: $error; text-style: bold; }
    StatusLine > .status-line--muted { color: $text-muted; }
    StatusLine > .status-line--run { color: $success; text-style: bold; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._nvml: NvmlStatus | None = None
        self._run_state = "idle"
        self._sampler_cpu_percent: float | None = None
        self._gpu_faults: tuple[str, ...] = ()

    def show(
        self,
        *,
        nvml: NvmlStatus | None,
        run_state: str,
        sampler_cpu_percent: float | None,
        gpu_faults: tuple[str, ...] = (),
    ) -> None:
        """`gpu_faults`: what failed on each GPU at the latest sample (`GpuSample.nvml_error`), shown as a banner."""
        shown = (nvml, run_state, sampler_cpu_percent, gpu_faults)
        if shown != (self._nvml, self._run_state, self._sampler_cpu_percent, self._gpu_faults):
            self._nvml, self._run_state, self._sampler_cpu_percent, self._gpu_faults = shown
            self.repaint_changes()  # a step counter or a figure: a few cells

    def rows_key(self) -> Hashable:
        return self._nvml, self._run_state, self._sampler_cpu_percent, self._gpu_faults

    def build_rows(self, width: int, height: int) -> list[Strip]:
        return text_rows(self, self.fitted(width), width, height)

    def render(self) -> Text:
        return self._text(short=False, sampler=True)

    def fitted(self, width: int) -> Text:
        """The line at `width` cells: whole where it fits, else shortened a part at a time — the sampler's cost
        first, then the NVML banner's reason (the toast and `?` say it) — and cut only at a word's end."""
        text = self._text(short=False, sampler=True)
        for short, sampler in ((False, False), (True, True), (True, False)):
            if text.cell_len <= width:
                return text
            text = self._text(short=short, sampler=sampler)
        if text.cell_len > width:
            cut = text.plain.rfind(" ", 0, max(0, width - 1))
            text = text[: max(cut, 0)]
            text.append("…")
        return text

    def _text(self, *, short: bool, sampler: bool) -> Text:
        # The run's progress first: at 80 columns it is what must show; the GPU and driver may be shortened.
        muted = self.component_style("status-line--muted")
        text = Text("gpuanat ", style="bold")
        text.append(printable(self._run_state), style=self.component_style("status-line--run"))
        text.append(" · ", style=muted)
        nvml = self._nvml
        if nvml is None:
            text.append("probing NVML…", style=muted)
        elif nvml.available:
            text.append(printable(gpu_names_text(nvml.gpu_names)))
            if not short:
                text.append(f" · driver {printable(nvml.driver_version)}", style=muted)
        else:
            banner = (
                " no NVML: host metrics only "
                if short
                else f" NVML unavailable: {printable(nvml.reason)} — host metrics only "
            )
            text.append(banner, style=self.component_style("status-line--banner"))
        if self._gpu_faults:
            text.append(" ")
            banner_style = self.component_style("status-line--banner")
            text.append(f" {printable('; '.join(self._gpu_faults))} ", style=banner_style)
        if sampler and self._sampler_cpu_percent is not None:
            text.append(f" · sampler {self._sampler_cpu_percent:.1f}% CPU", style=muted)
        return text
