"""Tables and ratios of a multi-LoRA serving run (the JSON bench/lora_serve.py writes).

    .venv/bin/python -m bench.lora_serve_report RESULTS.json [--markdown]

Per run (round x configuration): throughput, TTFT and ITL, and the shards' own decode step.
Per configuration: output tok/s of every round, their mean, and the ratio to the base model's
run, per round (same round, so the same machine state) and of the means, against the goal.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from bench.serve_report import _table, value

LATENCIES = ["TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms"]


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def run_table(results: dict[str, Any], markdown: bool = False) -> str:
    header = ["round", "config", "ok", "fail", "out tok/s", *LATENCIES]
    # The machine's 1-min load average when the run began (this server's own work included).
    header += ["decode steps", "decode step ms", "tokens/decode step", "load at start"]
    rows = []
    for run in results["runs"]:
        s, shard = run["summary"], run.get("shard_time") or {}
        steps = shard.get("decode_steps")
        step_s = shard.get("decode_step_mean_s")
        # Mean decode batch: every output token but each request's first comes from a Decode.
        batch = (s["output_tokens"] - s["completed"]) / steps if steps else None
        rows.append(
            [str(run["round"]), run["config"], str(s["completed"]), str(s["failed"])]
            + [_f(value(s, "out tok/s"), "{:.1f}")]
            + [_f(value(s, c), "{:.0f}" if "TTFT" in c else "{:.1f}") for c in LATENCIES]
            + [
                _f(steps, "{:d}"),
                _f(step_s * 1e3 if step_s else None, "{:.1f}"),
                _f(batch, "{:.1f}"),
                _f((run.get("load_average_at_start") or [None])[0], "{:.2f}"),
            ]
        )
    return _table(header, rows, markdown)


def ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per configuration: tok/s per round, mean, ratio to base per round and of the means,
    and latencies as the mean over rounds of each round's figure."""
    by_config: dict[str, list[dict[str, Any]]] = {}
    for run in results["runs"]:
        by_config.setdefault(run["config"], []).append(run)
    base = {r["round"]: value(r["summary"], "out tok/s") for r in by_config.get("base", [])}
    base_mean = sum(base.values()) / len(base) if base else math.nan
    goals = {str(k): v for k, v in results.get("meta", {}).get("goals", {}).items()}
    out = []
    for label, runs in by_config.items():
        runs = sorted(runs, key=lambda r: r["round"])
        tps = [value(r["summary"], "out tok/s") for r in runs]
        mean = sum(tps) / len(tps)
        per_round = [
            t / base[r["round"]] if base.get(r["round"]) else math.nan
            for r, t in zip(runs, tps, strict=True)
        ]
        row: dict[str, Any] = {
            "config": label,
            "adapters": runs[0]["adapters"],
            "tok_s": tps,
            "tok_s_mean": mean,
            "ratio_per_round": per_round,
            "ratio": mean / base_mean if base_mean else math.nan,
            "goal": goals.get(str(runs[0]["adapters"])),
        }
        for column in LATENCIES:
            row[column] = sum(value(r["summary"], column) for r in runs) / len(runs)
        out.append(row)
    return out


def ratio_table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    header = ["config", "out tok/s (rounds)", "mean", "/ base (rounds)", "/ base (means)", "goal"]
    header += [f"{c} (mean)" for c in LATENCIES]
    body = []
    for r in rows:
        goal = r["goal"]
        verdict = (
            "-" if goal is None else f">= {goal:.1f}x: {'met' if r['ratio'] >= goal else 'missed'}"
        )
        body.append(
            [r["config"], " / ".join(f"{t:.1f}" for t in r["tok_s"]), f"{r['tok_s_mean']:.1f}"]
            + [
                " / ".join(_f(x, "{:.2f}x") for x in r["ratio_per_round"]),
                _f(r["ratio"], "{:.2f}x"),
            ]
            + [verdict]
            + [_f(r[c], "{:.0f}" if "TTFT" in c else "{:.1f}") for c in LATENCIES]
        )
    return _table(header, body, markdown)


def report(results: dict[str, Any], markdown: bool = False) -> str:
    return "\n".join(
        [
            run_table(results, markdown),
            "",
            "Per configuration, against the base model on the same server "
            "(ratio = tok/s / base tok/s; adapters placed "
            f"{results.get('meta', {}).get('placement', 'round-robin')}):",
            ratio_table(ratios(results), markdown),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    print(report(json.loads(args.results.read_text()), args.markdown))


if __name__ == "__main__":
    main()
