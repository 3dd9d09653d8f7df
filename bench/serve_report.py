"""Tables (plain and Markdown), ratios and the plot of a serve benchmark's results.

Works on the JSON written by bench/serve.py, so a report can be redrawn from a saved file:
    .venv/bin/python -m bench.serve_report RESULTS.json [--plot OUT.png] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

# (column, how to read it from a level's summary, scale, format)
COLUMNS: list[tuple[str, tuple[str, ...], float, str]] = [
    ("ok", ("completed",), 1, "{:.0f}"),
    ("fail", ("failed",), 1, "{:.0f}"),
    ("out tok/s", ("output_throughput",), 1, "{:.1f}"),
    ("req/s", ("request_throughput",), 1, "{:.2f}"),
    ("TTFT p50 ms", ("ttft_s", "p50"), 1e3, "{:.0f}"),
    ("TTFT p99 ms", ("ttft_s", "p99"), 1e3, "{:.0f}"),
    ("TPOT p50 ms", ("tpot_s", "p50"), 1e3, "{:.1f}"),
    ("ITL p50 ms", ("itl_s", "p50"), 1e3, "{:.1f}"),
    ("ITL p90 ms", ("itl_s", "p90"), 1e3, "{:.1f}"),
    ("ITL p99 ms", ("itl_s", "p99"), 1e3, "{:.1f}"),
    ("E2E p50 s", ("e2e_s", "p50"), 1, "{:.2f}"),
    ("E2E p99 s", ("e2e_s", "p99"), 1, "{:.2f}"),
]
# Ratios of a server over the baseline; for latencies lower is better (a ratio < 1 is a win).
RATIOS = [
    "out tok/s",
    "req/s",
    "TTFT p50 ms",
    "TPOT p50 ms",
    "ITL p50 ms",
    "ITL p99 ms",
    "E2E p50 s",
]


def level_label(level: dict[str, Any]) -> str:
    # Results from before the random dataset have no "dataset": they are fixed-length.
    random_lengths = " random" if level.get("dataset", "fixed") == "random" else ""
    if level["mode"] == "concurrency":
        return f"c={level['value']}{random_lengths}"
    return f"rate={level['value']}/s{random_lengths}"


def value(summary: dict[str, Any], column: str) -> float:
    for name, path, scale, _ in COLUMNS:
        if name == column:
            v: Any = summary
            for key in path:
                v = v[key]
            return float(v) * scale if v is not None else math.nan
    raise KeyError(column)


def _fmt(column: str, v: float) -> str:
    fmt = next(f for name, _, _, f in COLUMNS if name == column)
    return "-" if math.isnan(v) else fmt.format(v)


def _table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    fmt = "  ".join("{:>" + str(w) + "}" for w in widths)
    return "\n".join(fmt.format(*r) for r in [header, *rows])


def server_table(results: dict[str, Any], markdown: bool = False) -> str:
    header = ["server", "level"] + [c for c, *_ in COLUMNS] + ["outside shard ms/step"]
    rows = []
    for name, server in results["servers"].items():
        for level in server["levels"]:
            s = level["summary"]
            shard = level.get("shard_time")
            # Between Poisson arrivals the server idles, which is not router time: c= levels only.
            steady = shard and level["mode"] == "concurrency"
            extra = f"{shard['outside_shard_per_step_s'] * 1e3:.1f}" if steady else "-"
            rows.append(
                [name, level_label(level)] + [_fmt(c, value(s, c)) for c, *_ in COLUMNS] + [extra]
            )
    return _table(header, rows, markdown)


def ratios(results: dict[str, Any], server: str, baseline: str) -> list[dict[str, Any]]:
    """Per level both servers ran: {level, column: server/baseline}."""
    base = {level_label(lv): lv["summary"] for lv in results["servers"][baseline]["levels"]}
    out = []
    for level in results["servers"][server]["levels"]:
        label = level_label(level)
        if label not in base:
            continue
        row: dict[str, Any] = {"level": label}
        for column in RATIOS:
            a, b = value(level["summary"], column), value(base[label], column)
            row[column] = a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan
        out.append(row)
    return out


def ratio_table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    header = ["level"] + [f"{c} ratio" for c in RATIOS]
    body = [
        [r["level"]] + ["-" if math.isnan(r[c]) else f"{r[c]:.2f}x" for c in RATIOS] for r in rows
    ]
    return _table(header, body, markdown)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on benchmark machines
    import matplotlib.pyplot as plt

    panels = [
        ("out tok/s", "output tokens/s"),
        ("TTFT p50 ms", "TTFT p50 (ms)"),
        ("ITL p99 ms", "ITL p99 (ms)"),
        ("TPOT p50 ms", "TPOT p50 (ms)"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (column, title) in zip(axes.flat, panels, strict=True):
        for name, server in results["servers"].items():
            for dataset, style in (("fixed", "o-"), ("random", "s--")):
                levels = [
                    lv
                    for lv in server["levels"]
                    if lv["mode"] == "concurrency" and lv.get("dataset", "fixed") == dataset
                ]
                if levels:
                    xs = [lv["value"] for lv in levels]
                    ys = [value(lv["summary"], column) for lv in levels]
                    label = name if dataset == "fixed" else f"{name} (random lengths)"
                    ax.plot(xs, ys, style, label=label)
        ax.set_title(title)
        ax.set_xlabel("concurrency")
        ax.set_xscale("log", base=2)
        levels = [lv for s in results["servers"].values() for lv in s["levels"]]
        ticks = sorted({lv["value"] for lv in levels if lv["mode"] == "concurrency"})
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        ax.legend()
    meta = results.get("meta", {})
    fig.suptitle(
        f"{meta.get('model', meta.get('model_name', ''))}: prompt {meta.get('input_len')} / output "
        f"{meta.get('output_len')} tokens, {meta.get('cpu', '')}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(results: dict[str, Any], baseline: str | None, markdown: bool = False) -> str:
    meta = results.get("meta", {})
    # Results written before the benchmarks ran real weights name no model: they ran the
    # random-weight SmolLM2-shaped one, with EOS ignored.
    model = meta.get("model", f"{meta.get('model_name', '?')} (random weights)")
    eos = "EOS ignored" if meta.get("ignore_eos", True) else "requests end at EOS"
    parts = [f"model: {model}; {eos}", server_table(results, markdown)]
    names = list(results["servers"])
    if baseline in names:
        for name in names:
            if name != baseline:
                parts.append(f"\n{name} / {baseline}:")
                parts.append(ratio_table(ratios(results, name, baseline), markdown))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Redraw a serve benchmark report")
    parser.add_argument("results", type=Path)
    parser.add_argument("--baseline", default="transformers")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    print(report(results, args.baseline, args.markdown))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
