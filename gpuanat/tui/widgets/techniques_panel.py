"""The techniques panel: every technique of the next run, its key, whether it can apply here, and the
predicted peak memory for these settings."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.geometry import Size
from textual.reactive import reactive
from textual.widget import Widget

from gpuanat.core.memory.model_config import trains_causal_lm
from gpuanat.core.memory.predict import MemoryEstimate, prediction_caveat
from gpuanat.core.printable import printable
from gpuanat.core.store.report import format_bytes
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.techniques import checkpointing_mode, compile_mode, weights_mode
from gpuanat.core.vocabulary.validation import machine_unsupported_reasons

ROWS: tuple[tuple[str, str, str], ...] = (
    # (RunConfig field, key shown, label)
    ("batch_size", "+/-", "batch size"),
    ("grad_accum", "a/A", "accumulation"),
    ("grad_checkpointing", "g", "checkpointing"),
    ("precision", "p", "precision"),
    ("tf32", "t", "tf32"),
    ("optim", "o", "optimizer"),
    ("workers", "w", "workers"),
    ("pin_memory", "m", "pin memory"),
    ("attn", "e", "attention"),
    ("compile", "c", "compile"),
    ("expandable_segments", "x", "exp. segments"),
)
ENGINE_ROW = ("engine", "E", "engine")
"""Shown once the engine is not the default Trainer."""
WEIGHTS_ROW = ("weights_dtype", "W", "weights")
"""Shown once the model is held in bf16."""
LORA_ROW = ("lora", "L", "LoRA rank")
"""Shown once LoRA is on."""
QLORA_ROW = ("load_in_4bit", "4", "4-bit base")
"""Shown once LoRA is on: QLoRA's NF4 base under the adapters."""
LIGER_ROWS = (("liger", "K", "Liger loss"), ("liger_layers", "Y", "Liger layers"))
"""Shown for a causal LM (its loss and layers are what Liger's kernels replace), and once on."""
DATA_ROWS = (("data", "d", "data"), ("padding", "P", "padding"))
"""Shown once the run trains on --data (random data has no padding)."""
SEVERAL_GPU_ROWS: tuple[tuple[str, str, str], ...] = (
    ("gpus", "G", "GPUs"),
    ("distributed", "D", "distributed"),
)
"""Shown where NVML lists several GPUs, or a run was asked for more than one."""
BLOCKING_FLAGS = {
    "--precision": "precision",
    "--tf32": "tf32",
    "--optim": "optim",
    "--device": "device",
    "--expandable-segments": "expandable_segments",
    "--distributed": "distributed",
    "--lora": "lora",
    "--load-in-4bit": "load_in_4bit",
    "--liger": "liger",
    "--liger-layers": "liger_layers",
}


def _value_text(field: str, value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if field == "gpus" and value is None:
        return "1 (first idle)"
    if field == "data" and isinstance(value, str):  # the file's name: the panel is narrow; escaped, it is the user's
        return printable(value.rstrip("/").rsplit("/", 1)[-1] or value)
    return str(value)


class TechniquesPanel(Widget):
    """Shows a RunConfig; the app sets it with `show` whenever a key changes a technique."""

    COMPONENT_CLASSES = {
        "techniques-panel--key",
        "techniques-panel--changed",
        "techniques-panel--unavailable",
        "techniques-panel--warning",
        "techniques-panel--muted",
    }
    DEFAULT_CSS = """
    TechniquesPanel {
        height: auto;
        padding: 0 1;
        border: round $primary;
        border-title-color: $text;
    }
    TechniquesPanel > .techniques-panel--key { color: $accent; text-style: bold; }
    TechniquesPanel > .techniques-panel--changed { color: $success; text-style: bold; }
    TechniquesPanel > .techniques-panel--unavailable { color: $error; }
    TechniquesPanel > .techniques-panel--warning { color: $warning; text-style: bold; }
    TechniquesPanel > .techniques-panel--muted { color: $text-muted; }
    """

    compact: reactive[bool] = reactive(False)
    """Leave out the workload line (the compact layout of short terminals)."""

    def __init__(self, config: RunConfig, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Techniques (next run)"
        self._config = config
        self._capabilities: Capabilities | None = None
        self._estimate: MemoryEstimate | None = None
        self._gpu_total_bytes: int | None = None
        self._device_peak_bytes: int | None = None
        self._caveat: str | None = None
        self._not_predicted: str | None = None
        """Why the configured run has no prediction at all (the whole model compiled), said in its place."""
        self._predicted_seq_len: int | None = None
        """The length predicted at where it is not --seq-len: a --data run's longest batch."""
        self._several_gpus = False
        self._available_lines: int | None = None
        """The lines the panel's container leaves it (None until laid out): rows at their defaults fold into one
        line where every row would not fit, so that the rows changed, the GPUs and the prediction stay in sight."""

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        available = max(1, container.height)  # for an auto height, the container less this panel's border
        if available != self._available_lines:
            self._available_lines = available
            # Textual caches the content's height by width and the rendered visual until a refresh: both depend on
            # the height left here now
            self._content_height_cache = (None, 0)
            self._layout_cache.pop("_render.visual", None)
        return super().get_content_height(container, viewport, width)

    def show(
        self,
        config: RunConfig,
        *,
        capabilities: Capabilities | None,
        estimate: MemoryEstimate | None,
        gpu_total_bytes: int | None,
        device_peak_bytes: int | None,
        several_gpus: bool = False,
        not_predicted: str | None = None,
        predicted_seq_len: int | None = None,
    ) -> None:
        """`device_peak_bytes`: the predicted peak (of one rank) with the allocator's cache and the CUDA context;
        `several_gpus`: show the GPU and distributed rows; `not_predicted`: why there is no prediction (with
        `estimate` None), the whole of it in the tooltip; `predicted_seq_len`: the length `estimate` is at where it is
        not --seq-len (a --data run's longest batch), said under the prediction."""
        self._config, self._capabilities, self._estimate = config, capabilities, estimate
        self._not_predicted = not_predicted
        self._predicted_seq_len = predicted_seq_len if estimate is not None else None
        self._gpu_total_bytes, self._device_peak_bytes = gpu_total_bytes, device_peak_bytes
        self._several_gpus = several_gpus or config.ranks != 1
        # What no measurement checked of this prediction (a decoder in fp32, FSDP2 on 8 GPUs, …): said beside it
        self._caveat = prediction_caveat(config) if estimate is not None and config.device == "cuda" else None
        reasons = machine_unsupported_reasons(config, capabilities) if capabilities else []
        # Text, not markup: a reason names packages such as gpuanat[llm], a caveat a model's family.
        tooltip = "\n".join(
            [f"{flag}: {reason}" for flag, reason in reasons]
            + ([f"prediction unchecked: {self._caveat}"] if self._caveat else [])
            + ([f"no prediction: {not_predicted}"] if not_predicted else [])
            + (
                [
                    f"predicted at seq {self._predicted_seq_len}: the longest of --data's rows (--padding longest), "
                    f"as gpuanat predict sizes it; --seq-len {config.seq_len} truncates longer rows"
                ]
                if self._predicted_seq_len is not None
                else []
            )
        )
        self.tooltip = Text(printable(tooltip, keep="\n")) if tooltip else None
        self.refresh(layout=True)

    def render(self) -> Table:
        key_style = self.get_component_rich_style("techniques-panel--key")
        changed_style = self.get_component_rich_style("techniques-panel--changed")
        muted = self.get_component_rich_style("techniques-panel--muted")
        table = Table.grid(padding=(0, 1))
        table.add_column(justify="right", no_wrap=True, min_width=3)
        table.add_column(no_wrap=True)
        table.add_column(no_wrap=True)
        config, defaults = self._config, RunConfig()
        unsupported = machine_unsupported_reasons(config, self._capabilities) if self._capabilities else []
        blocked_fields = {BLOCKING_FLAGS.get(flag) for flag, _ in unsupported}
        causal_lm = trains_causal_lm(config)
        extra_rows = (
            ((WEIGHTS_ROW,) if config.weights_dtype != defaults.weights_dtype else ())
            + ((ENGINE_ROW,) if config.engine != defaults.engine else ())
            + ((LORA_ROW, QLORA_ROW) if config.lora or config.load_in_4bit else ())
            + (LIGER_ROWS if causal_lm or config.liger or config.liger_layers else ())
            + (DATA_ROWS if config.data is not None else ())
        )
        rows = ROWS + extra_rows + (SEVERAL_GPU_ROWS if self._several_gpus else ())
        values = {
            field: (
                (compile_mode(config), compile_mode(defaults))
                if field == "compile"
                else (weights_mode(config), weights_mode(defaults))
                if field == "weights_dtype"
                else (checkpointing_mode(config), checkpointing_mode(defaults))
                if field == "grad_checkpointing"
                else (getattr(config, field), getattr(defaults, field))
            )
            for field, _, _ in rows
        }
        prediction = self._prediction_text()
        folded = self._rows_to_fold(rows, values, blocked_fields, bool(unsupported), prediction)
        for field, key, label in rows:
            if field in folded:
                continue
            value, default = values[field]
            style = changed_style if value != default else ""
            if field in blocked_fields:
                style = self.get_component_rich_style("techniques-panel--unavailable")
            table.add_row(
                Text(key, style=key_style), Text(label, style=muted), Text(_value_text(field, value), style=style)
            )
        lines = Table.grid()
        unavailable = None
        if unsupported:
            unavailable_style = self.get_component_rich_style("techniques-panel--unavailable")
            if self.compact:  # one line, so that every row keeps its place at 80×24; u says the reasons
                unavailable = Text.assemble(
                    (f"{len(unsupported)} unavailable (red): ", unavailable_style),
                    ("u", key_style),
                    (" says why", unavailable_style),
                    overflow="ellipsis",
                    no_wrap=True,
                )
            else:
                more = f" (+{len(unsupported) - 1} more, in red above; u says all)" if len(unsupported) > 1 else ""
                unavailable = Text(f"unavailable: {printable(unsupported[0][1])}{more}", style=unavailable_style)
        if unavailable is not None and self.compact:  # first: at 80×24 the rows fill the panel's height
            lines.add_row(unavailable)
        lines.add_row(table)
        if folded:
            folded_rows = [(key, label) for field, key, label in rows if field in folded]
            at_defaults = Text("at defaults: " + ", ".join(label for _, label in folded_rows), style=muted)
            if self.size.width and at_defaults.cell_len > self.size.width:  # by their keys, so that none is cut off
                at_defaults = Text("at defaults: ", style=muted)
                for index, (key, _) in enumerate(folded_rows):
                    at_defaults.append(" " if index else "", style=muted)
                    at_defaults.append(key, style=key_style)
                at_defaults.append(" (? names them)", style=muted)
            at_defaults.overflow, at_defaults.no_wrap = "ellipsis", True
            lines.add_row(at_defaults)
        if not self.compact:
            lines.add_row(
                Text.assemble(
                    ("[/] ", key_style),  # the run's length, its keys first as in the rows above
                    (
                        f"{config.samples} samples · {printable(config.model or config.preset)} on {config.device}, "
                        f"seq {config.seq_len}",
                        muted,
                    ),
                    overflow="ellipsis",
                    no_wrap=True,
                )
            )
        if unavailable is not None and not self.compact:
            lines.add_row(unavailable)
        elif self._capabilities is None:
            lines.add_row(Text("checking what this machine can run…", style=muted))
        lines.add_row(prediction)
        length_line = self._length_line()
        if length_line is not None:
            lines.add_row(length_line)
        return lines

    def _rows_to_fold(
        self,
        rows: tuple[tuple[str, str, str], ...],
        values: dict[str, tuple[object, object]],
        blocked: set[str | None],
        unavailable_line: bool,
        prediction: Text,
    ) -> set[str]:
        """The base rows at their defaults that give way, last first, where the panel's lines would not fit the
        height left to it; a technique changed, unavailable, or of the rows shown on demand (GPUs, LoRA, …) stays."""
        if self._available_lines is None:
            return set()
        width = self.size.width
        wraps = width and not prediction.no_wrap  # "… will not fit" wraps; the CPU's line is cut
        prediction_lines = -(-prediction.cell_len // width) if wraps else 1
        extra_lines = (
            prediction_lines
            + (self._predicted_seq_len is not None)
            + unavailable_line
            + (not self.compact)
            + (self._capabilities is None)
        )
        overflow = len(rows) + extra_lines - self._available_lines
        if overflow <= 0:
            return set()
        candidates = [field for field, _, _ in ROWS if values[field][0] == values[field][1] and field not in blocked]
        return set(candidates[-(overflow + 1) :])  # one line stands for them: fold one more than the overflow

    def _prediction_text(self) -> Text:
        muted = self.get_component_rich_style("techniques-panel--muted")
        if self._not_predicted is not None:  # why, in short (whole in the tooltip and `gpuanat predict`)
            text = Text("predicted peak: ", style=muted)
            text.append("none", style=self.get_component_rich_style("techniques-panel--warning"))
            text.append(
                printable(
                    " — the whole model compiled is not predicted (inductor chooses what to save or recompute; "
                    "bert-large took 1.7× eager's memory); c: eager, then compiled regions, both predicted"
                ),
                style=muted,
            )
            return text
        if self._estimate is None:
            return Text("predicted peak: —", style=muted)
        if self._config.device != "cuda":
            # The bytes model is of CUDA memory (its activations, workspaces and allocator): on the CPU only the
            # tensor bands, which are exact, are predicted.
            estimate = self._estimate
            state = estimate.weights_bytes + estimate.gradients_bytes + estimate.optimizer_state_bytes
            return Text(
                f"predicted weights+grads+optimizer: {format_bytes(state)} (CPU: no activation model)",
                style=muted,
                overflow="ellipsis",
                no_wrap=True,
            )
        device_peak = self._device_peak_bytes or self._estimate.peak_allocated_bytes
        label = "predicted/GPU" if self._estimate.ranks > 1 else "predicted peak"
        text = Text(label)
        if self._caveat:  # first, where a narrow panel cannot cut it; why: in the tooltip, and in `gpuanat predict`
            text.append(" (unchecked)", style=muted)
        text.append(f": {format_bytes(device_peak)}")
        if self._gpu_total_bytes:
            text.append(f" of {format_bytes(self._gpu_total_bytes)}", style=muted)
            if device_peak > self._gpu_total_bytes:
                text.append("  will not fit", style=self.get_component_rich_style("techniques-panel--warning"))
        return text

    def _length_line(self) -> Text | None:
        """ "at seq 11: --data's longest row", under the prediction where it is at another length than
        --seq-len (a --data run's longest batch); why, in the tooltip."""
        if self._predicted_seq_len is None:
            return None
        return Text(
            f"at seq {self._predicted_seq_len}: --data's longest row",
            style=self.get_component_rich_style("techniques-panel--muted"),
            overflow="ellipsis",
            no_wrap=True,
        )
