"""Tables of runs for the terminal and for export: rows as plain values, rendered as md, CSV or JSON.

The CLI renders the same rows as a terminal table; this module stays free of any UI library.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuanat.core.operations.anatomy import group_share
from gpuanat.core.percent import percent_delta
from gpuanat.core.printable import printable
from gpuanat.core.store.history import RunRow
from gpuanat.core.store.searches import SearchLine
from gpuanat.core.vocabulary.config import RunConfig

MIB = 1024**2
GIB = 1024**3
TIB = 1024**4


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    numeric: bool = False
    keep: int = 0
    """Where a terminal too narrow for every column drops columns: the highest `keep` goes first, 0 never."""
    shrinks: bool = False
    """Free text that may be cut short (with an ellipsis) before any column is dropped."""


TABLE_CELL_PADDING = 3
"""Characters a terminal table adds per column beyond its text: a space each side and a separator."""
SHRUNK_COLUMN_MIN = 12
"""The narrowest a shrinking column is cut to before columns are dropped instead."""


def fit_columns(
    columns: Sequence[Column], rows: Sequence[dict[str, Any]], width: int
) -> tuple[list[Column], dict[str, int]]:
    """The columns that fit `width` characters, in their order, and the widths to cut shrinking ones to: first
    shrinking columns are cut (down to SHRUNK_COLUMN_MIN), then columns are dropped, highest `keep` first. Columns
    with `keep` 0 always stay (the table may then be wider than `width`)."""

    def natural(column: Column) -> int:
        cells = [len(display_value(column.key, row.get(column.key))) for row in rows]
        return max([len(column.title), *cells])

    widths = {column.key: natural(column) for column in columns}
    kept = list(columns)

    def total() -> int:
        return sum(widths[column.key] + TABLE_CELL_PADDING for column in kept)

    for column in kept:
        if column.shrinks and total() > width:
            widths[column.key] = max(min(widths[column.key], SHRUNK_COLUMN_MIN), widths[column.key] - (total() - width))
    for column in sorted((c for c in kept if c.keep), key=lambda c: -c.keep):
        if total() <= width:
            break
        kept.remove(column)
    return kept, {column.key: widths[column.key] for column in kept if column.shrinks}


def format_bytes(value: int | None) -> str:
    if value is None:
        return "—"
    if abs(value) >= TIB:
        return f"{value / TIB:.2f} TiB"
    if abs(value) >= GIB:
        return f"{value / GIB:.2f} GiB"
    return f"{value / MIB:.0f} MiB"


def format_mb(value: int | None) -> str:
    """Decimal-free MB as the HF docs print 'GPU memory occupied' (MiB, labelled MB there)."""
    return "—" if value is None else f"{value // MIB}"


def format_number(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def format_loss(value: float | None) -> str:
    """A loss to four significant digits, as the Trainer's log shows it ("0.2435", "10.37")."""
    return "—" if value is None else f"{value:.4g}"


def format_delta(value: float | None) -> str:
    return "" if value is None else f"{value:+.1f}%"


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` and `noun`, in the plural unless it is one: "1 run", "3 runs"."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


HISTORY_COLUMNS = (
    Column("id", "id", numeric=True),
    Column("when", "when", keep=7),
    Column("name", "name", shrinks=True),
    Column("status", "status"),
    Column("model", "model", keep=4),
    Column("techniques", "techniques", keep=3, shrinks=True),
    Column("device", "device", keep=8, shrinks=True),
    Column("time_s", "time s", numeric=True, keep=6),
    Column("samples_per_second", "samples/s", numeric=True),
    Column("steady_samples_per_second", "steady/s", numeric=True, keep=5),
    Column("loss", "loss", numeric=True, keep=14),
    Column("peak_allocated", "peak alloc", numeric=True, keep=2),
    Column("gpu_memory_mb", "GPU mem MiB", numeric=True, keep=1),
    Column("achieved_tflops", "TFLOP/s", numeric=True, keep=7),
    Column("mfu", "MFU", numeric=True, keep=8),
    Column("tensor_active_percent", "tensor %", numeric=True, keep=12),
    Column("joules_per_sample", "J/sample", numeric=True, keep=13),
    Column("prediction_error_delta", "pred err", numeric=True, keep=9),
    Column("bottleneck", "bottleneck", keep=10),
    Column("operations", "ops C/N/E %", keep=11),
)
"""At 80 columns: id, name, status, samples/s, GPU memory, peak allocated (and techniques, cut short). Tensor % and
J/sample (the GPU's steady activity and energy, `measure.activity`) stand beside MFU and go first; before them the
loss (the last the loop logged, `final_loss`), which a CSV or JSON export always has."""


TAGS_COLUMN = Column("tags", "tags", keep=5, shrinks=True)
"""A run's tags, comma-separated: after HISTORY_COLUMNS in md and CSV, and in a table where a run shown has any."""


def listing_rows(lines: Sequence[RunRow | SearchLine]) -> list[dict[str, Any]]:
    """`history_rows` of runs and folded searches (`searches.fold_searches`): a search's row is its best trial's,
    its id the search's ("s3") and its name what it was and how many trials it ran; its tags those of any trial."""
    rows = history_rows([line.best if isinstance(line, SearchLine) else line for line in lines])
    for index, line in enumerate(lines):
        if isinstance(line, SearchLine):
            tags = sorted({tag for trial in line.trials for tag in trial.tags})
            rows[index] = {**rows[index], "id": line.key, "name": line.words(), "tags": ", ".join(tags) or None}
    return rows


def history_rows(runs: Sequence[RunRow]) -> list[dict[str, Any]]:
    """One row per run, values raw (numbers stay numbers) for export."""
    rows = []
    techniques: dict[tuple[str, int], str] = {}
    """By kind and config: runs of one config (`history_listing` shares its dict) say their techniques once."""
    for run in runs:
        result, config = run.result, run.config
        summary = techniques.get((run.kind, id(config)))
        if summary is None:
            summary = techniques[run.kind, id(config)] = _techniques(run.kind, config)
        rows.append(
            {
                "id": run.id,
                "when": datetime.fromtimestamp(run.created_at).strftime("%Y-%m-%d %H:%M"),
                # a name given, else what the run was when that says something ("watched"); a plain run has none
                "name": run.name or (None if run.kind == "launched" else run.kind),
                "status": run.status,
                "model": config.get("model") or config.get("preset") or _script_name(config),
                "techniques": summary,
                "device": result.gpu_name or result.device_name or config.get("device"),
                "time_s": result.train_runtime_s,
                "samples_per_second": result.samples_per_second,
                "steady_samples_per_second": result.steady_samples_per_second,
                "loss": result.final_loss,
                "peak_allocated": result.peak_allocated_bytes,
                "gpu_memory_mb": result.device_memory_used_bytes,
                "achieved_tflops": result.achieved_tflops,
                "mfu": result.mfu,
                "tensor_active_percent": result.tensor_active_percent,
                "joules_per_sample": result.joules_per_sample,
                "prediction_error_delta": result.prediction_error_percent,
                "bottleneck": next((finding.get("bottleneck") for finding in result.diagnosis or []), None),
                "operations": operations_shares(result.operations_anatomy),
                "tags": ", ".join(run.tags) or None,
            }
        )
    return rows


def operations_shares(anatomy: Any) -> str | None:
    """A profiled run's time shares of contractions / normalizations / element-wise, "88/3/3" (None: not
    profiled)."""
    groups = ("contractions", "normalizations", "elementwise")
    shares = [share for group in groups if (share := group_share(anatomy, group)) is not None]
    return None if len(shares) < len(groups) else "/".join(f"{100 * share:.0f}" for share in shares)


def _script_name(config: dict[str, Any]) -> str | None:
    """The user's script of a `run --script` or watched run: its file name, else the command's program."""
    words = [config["script"]] if config.get("script") else (config.get("command") or "").split()
    scripts = [word for word in words if word.endswith(".py")] or words[:1]
    return scripts[0].rsplit("/", 1)[-1] if scripts else None


def _techniques(kind: str, config: dict[str, Any]) -> str:
    """The techniques of a run; a watched run or a user's script says so when its probe reported none."""
    known = {key: value for key, value in config.items() if value is not None}
    if "batch_size" not in known and (kind == "watched" or "script" in config):
        return "watched" if kind == "watched" else "script"
    return RunConfig.from_json(known).techniques_summary()


SWEEP_COLUMNS = (
    Column("name", "experiment"),
    Column("status", "status"),
    Column("time_s", "Time s", numeric=True),
    Column("time_delta", "Δ time", numeric=True),
    Column("samples_per_second", "Samples/s", numeric=True),
    Column("samples_per_second_delta", "Δ samples/s", numeric=True),
    Column("steady_samples_per_second", "Steady/s", numeric=True),
    Column("steady_delta", "Δ steady", numeric=True),
    Column("gpu_memory_mb", "GPU mem MiB", numeric=True),
    Column("memory_delta", "Δ mem", numeric=True),
    Column("peak_allocated", "Peak alloc", numeric=True),
    Column("tensor_active_percent", "Tensor %", numeric=True),
    Column("joules_per_sample", "J/sample", numeric=True),
    Column("joules_per_sample_delta", "Δ J/sample", numeric=True),
    Column("reason", "reason"),
)
"""The docs' experiment table, and how busy each experiment kept the GPU's tensor pipes and what a sample cost in
energy (lower is better); `unavailable_notes` says why a value is missing."""
ACTIVITY_TITLES = {"tensor_active_percent": "Tensor %", "joules_per_sample": "J/sample"}
"""The activity columns of the sweep table whose missing values `unavailable_notes` explains."""


def sweep_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sweep table rows with % deltas against the first (vanilla) row."""
    baseline = results[0] if results and results[0].get("status") == "ok" else {}
    rows = []
    for result in results:
        memory = result.get("device_memory_used_bytes")
        rows.append(
            {
                "name": result.get("name"),
                "status": result.get("status"),
                "time_s": result.get("train_runtime_s"),
                "time_delta": percent_delta(result.get("train_runtime_s"), baseline.get("train_runtime_s")),
                "samples_per_second": result.get("samples_per_second"),
                "samples_per_second_delta": percent_delta(
                    result.get("samples_per_second"), baseline.get("samples_per_second")
                ),
                "steady_samples_per_second": result.get("steady_samples_per_second"),
                "steady_delta": percent_delta(
                    result.get("steady_samples_per_second"), baseline.get("steady_samples_per_second")
                ),
                "gpu_memory_mb": memory,
                "memory_delta": percent_delta(memory, baseline.get("device_memory_used_bytes")),
                "peak_allocated": result.get("peak_allocated_bytes"),
                "tensor_active_percent": result.get("tensor_active_percent"),
                "joules_per_sample": result.get("joules_per_sample"),
                "joules_per_sample_delta": percent_delta(
                    result.get("joules_per_sample"), baseline.get("joules_per_sample")
                ),
                "reason": result.get("reason") or "",
            }
        )
    return rows


def unavailable_notes(results: Sequence[dict[str, Any]]) -> list[str]:
    """One line per reason the experiments that trained give for a "—" in an activity column (`ACTIVITY_TITLES`):
    '"—" in Tensor %, J/sample (2 experiments: vanilla, fp16): CPU run: it uses no GPU memory'. Made printable."""
    missing: dict[str, dict[str, list[str]]] = {}
    """reason -> column title -> the experiments it explains."""
    for result in results:
        if result.get("status") != "ok":
            continue  # an experiment that did not train says why in its reason column
        for key, title in ACTIVITY_TITLES.items():
            if result.get(key) is None:
                reason = (result.get("unavailable") or {}).get(key) or "not recorded"
                missing.setdefault(reason, {}).setdefault(title, []).append(str(result.get("name")))
    lines = []
    for reason, titles in missing.items():
        names = list(dict.fromkeys(name for named in titles.values() for name in named))
        lines.append(f"“—” in {', '.join(titles)} ({counted(len(names), 'experiment')}: {', '.join(names)}): {reason}")
    return [printable(line) for line in lines]


def format_joules(value: float) -> str:
    """Joules with three decimals under 10 J (a small model's sample costs a fraction of one), else one."""
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def display_value(key: str, value: Any) -> str:
    """How a raw row value reads in a table: figures formatted, text from outside (names, models, reasons) made
    printable."""
    if value is None:
        return "" if key.endswith("delta") or key == "reason" else "—"
    if key.endswith("delta"):
        return format_delta(value)
    if key == "gpu_memory_mb":
        return format_mb(value)
    if key == "peak_allocated":
        return format_bytes(value)
    if key == "achieved_tflops":
        return f"{value:.1f}" if value >= 1 else f"{value:.3f}"
    if key == "mfu":
        return f"{100 * value:.1f}%"
    if key == "tensor_active_percent":
        return f"{value:.1f}%"
    if key == "joules_per_sample":
        return format_joules(value)
    if key == "loss":
        return format_loss(value)
    if key in ("time_s", "samples_per_second", "steady_samples_per_second"):
        return format_number(value)
    return printable(value)


def render_markdown(columns: Sequence[Column], rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| " + " | ".join(column.title for column in columns) + " |",
        "| " + " | ".join("---:" if column.numeric else "---" for column in columns) + " |",
    ]
    for row in rows:
        cells = [display_value(column.key, row.get(column.key)).replace("|", "\\|") for column in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_csv(columns: Sequence[Column], rows: Sequence[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")  # csv's default ends lines with \r\n, as no Unix tool does
    writer.writerow([column.key for column in columns])
    for row in rows:
        writer.writerow(["" if row.get(column.key) is None else _csv_value(row.get(column.key)) for column in columns])
    return buffer.getvalue()


def _csv_value(value: Any) -> Any:
    """Figures as they are (a spreadsheet reads them whole); text made printable."""
    return printable(value) if isinstance(value, str) else value


def render_json(rows: Sequence[dict[str, Any]]) -> str:
    return json.dumps(list(rows), indent=2)
