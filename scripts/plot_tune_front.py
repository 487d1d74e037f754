"""Draw a `gpuanat tune --json` result as an SVG: every ok trial's samples/s against its peak memory, the Pareto front
joined, the best circled, refused (OOM) trials marked at their batch's memory where known.

    python scripts/plot_tune_front.py benchmarks/results/h100/tune/tune.json screenshots/tune_front.svg
"""

from __future__ import annotations

import argparse
import html
import json
from pathlib import Path

WIDTH, HEIGHT = 760, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 230, 40, 50
GIB = 1024**3


def _nice_ceiling(value: float) -> float:
    for step in (1, 2, 5, 10, 20, 25, 50, 100, 200, 500):
        if value <= step * 10:
            return step * (int(value / step) + 1)
    return value


def plot(summary: dict) -> str:
    trials = [
        t for t in summary["trials"] if t["status"] == "ok" and t["samples_per_second"] and t["peak_memory_bytes"]
    ]
    front = {t["index"] for t in summary["front"]}
    best = (summary.get("best") or {}).get("index")
    max_memory = _nice_ceiling(max([t["peak_memory_bytes"] / GIB for t in trials] + [1]))
    max_rate = _nice_ceiling(max([t["samples_per_second"] for t in trials] + [1]))
    plot_width, plot_height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(memory_gib: float) -> float:
        return LEFT + plot_width * memory_gib / max_memory

    def y(rate: float) -> float:
        return TOP + plot_height * (1 - rate / max_rate)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="monospace" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#1e1e2e"/>',
        f'<text x="{LEFT}" y="22" fill="#cdd6f4" font-size="14">gpuanat tune: samples/s against peak memory '
        f"({html.escape(summary.get('memory_source_description') or '')})</text>",
    ]
    for tick in range(6):
        rate, memory = max_rate * tick / 5, max_memory * tick / 5
        parts += [
            f'<line x1="{LEFT}" x2="{LEFT + plot_width}" y1="{y(rate):.1f}" y2="{y(rate):.1f}" stroke="#313244"/>',
            f'<text x="{LEFT - 8}" y="{y(rate) + 4:.1f}" fill="#a6adc8" text-anchor="end">{rate:.0f}</text>',
            f'<text x="{x(memory):.1f}" y="{TOP + plot_height + 18}" fill="#a6adc8" '
            f'text-anchor="middle">{memory:.0f}</text>',
        ]
    parts += [
        f'<text x="{LEFT + plot_width / 2}" y="{HEIGHT - 10}" fill="#cdd6f4" text-anchor="middle">'
        "peak memory (GiB)</text>",
        f'<text x="16" y="{TOP + plot_height / 2}" fill="#cdd6f4" text-anchor="middle" '
        f'transform="rotate(-90 16 {TOP + plot_height / 2})">samples/s</text>',
    ]
    on_front = sorted((t for t in trials if t["index"] in front), key=lambda t: t["peak_memory_bytes"])
    if len(on_front) > 1:
        points = " ".join(f"{x(t['peak_memory_bytes'] / GIB):.1f},{y(t['samples_per_second']):.1f}" for t in on_front)
        parts.append(f'<polyline points="{points}" fill="none" stroke="#a6e3a1" stroke-width="2"/>')
    for trial in trials:
        cx, cy = x(trial["peak_memory_bytes"] / GIB), y(trial["samples_per_second"])
        colour = "#a6e3a1" if trial["index"] in front else "#89b4fa"
        parts.append(
            f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4" fill="{colour}"><title>'
            f"{html.escape(trial['name'])}: {html.escape(trial['techniques'])}, "
            f"{trial['samples_per_second']:.1f} samples/s</title></circle>"
        )
        if trial["index"] == best:
            parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="9" fill="none" stroke="#f9e2af" stroke-width="2"/>')
    legend_x = WIDTH - RIGHT + 16
    lines = [("#f9e2af", "best"), ("#a6e3a1", "on the front"), ("#89b4fa", "other trials")]
    for row, (colour, label) in enumerate(lines):
        parts += [
            f'<circle cx="{legend_x}" cy="{TOP + 10 + 18 * row}" r="4" fill="{colour}"/>',
            f'<text x="{legend_x + 10}" y="{TOP + 14 + 18 * row}" fill="#cdd6f4">{label}</text>',
        ]
    for row, trial in enumerate(sorted(on_front, key=lambda t: -t["samples_per_second"])[:12]):
        text = f"{trial['samples_per_second']:.0f}/s {trial['techniques']}"[:30]
        parts.append(f'<text x="{legend_x}" y="{TOP + 80 + 16 * row}" fill="#a6e3a1">{html.escape(text)}</text>')
    failed = len([t for t in summary["trials"] if t["status"] != "ok"])
    parts.append(
        f'<text x="{legend_x}" y="{HEIGHT - 30}" fill="#a6adc8">{len(trials)} ok trials, {failed} not ok,'
        f'</text><text x="{legend_x}" y="{HEIGHT - 14}" fill="#a6adc8">{len(summary["pruned"])} pruned by '
        "prediction</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tune_json", type=Path)
    parser.add_argument("svg", type=Path)
    args = parser.parse_args()
    lines = args.tune_json.read_text().strip().splitlines()
    args.svg.write_text(plot(json.loads(lines[-1]) if len(lines) > 1 else json.loads(lines[0])))


if __name__ == "__main__":
    main()
