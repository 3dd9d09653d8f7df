"""bench/quant_decode.py's tables: decode tok/s and peak RSS with AWQ / bf16 ratios."""

from __future__ import annotations

import statistics
from typing import Any

MIB = 2**20


def summarize(pairs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per (pair, batch): each round's tok/s for both models and the ratio of their medians;
    per (pair, model): memory at each stage."""
    decode, memory = [], []
    for p in pairs:
        for batch in sorted({c["batch"] for c in p["cases"]}):
            row: dict[str, Any] = {"pair": p["pair"], "batch": batch}
            for kind in ("bf16", "awq"):
                cases = [c for c in p["cases"] if c["batch"] == batch and c["model"] == kind]
                cases.sort(key=lambda c: c["round"])
                row[f"{kind}_tok_s"] = [c["decode_tok_s"] for c in cases]
                row[f"{kind}_step_ms"] = [c["decode_rpc_ms"] for c in cases]
                row[f"{kind}_median_tok_s"] = statistics.median(row[f"{kind}_tok_s"])
            row["ratio"] = row["awq_median_tok_s"] / row["bf16_median_tok_s"]
            row["ratio_per_round"] = [
                a / b for a, b in zip(row["awq_tok_s"], row["bf16_tok_s"], strict=True)
            ]
            decode.append(row)
        peak_bf16 = p["shards"]["bf16"]["memory"]["end"]["VmHWM"]
        for kind, s in p["shards"].items():
            mem = s["memory"]
            memory.append(
                {
                    "pair": p["pair"],
                    "model": kind,
                    "dtype": s["dtype"],
                    "checkpoint_mib": s["checkpoint_bytes"] / MIB,
                    "hwm_loaded_mib": mem["loaded"]["VmHWM"] / MIB,
                    "hwm_warm_mib": mem["warm"]["VmHWM"] / MIB,
                    "hwm_end_mib": mem["end"]["VmHWM"] / MIB,
                    "rss_anon_end_mib": mem["end"]["RssAnon"] / MIB,
                    "hwm_ratio": mem["end"]["VmHWM"] / peak_bf16,
                }
            )
    return {"decode": decode, "memory": memory}


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _each(values: list[float], fmt: str) -> str:
    return " / ".join(fmt.format(v) for v in values)


def markdown(result: dict[str, Any]) -> str:
    env, summary = result["environment"], result["summary"]
    decode = _table(
        [
            "model",
            "batch",
            "bf16 tok/s (rounds)",
            "AWQ tok/s (rounds)",
            "bf16 ms/step (rounds)",
            "AWQ ms/step (rounds)",
            "AWQ / bf16 (median)",
            "AWQ / bf16 (rounds)",
        ],
        [
            [
                r["pair"],
                str(r["batch"]),
                _each(r["bf16_tok_s"], "{:.1f}"),
                _each(r["awq_tok_s"], "{:.1f}"),
                _each(r["bf16_step_ms"], "{:.1f}"),
                _each(r["awq_step_ms"], "{:.1f}"),
                f"**{r['ratio']:.2f}x**",
                _each(r["ratio_per_round"], "{:.2f}x"),
            ]
            for r in summary["decode"]
        ],
    )
    memory = _table(
        [
            "model",
            "shard",
            "dtype",
            "checkpoint MiB",
            "peak RSS after load MiB",
            "after warmup MiB",
            "at end MiB",
            "anon RSS at end MiB",
            "peak / bf16's",
        ],
        [
            [
                m["pair"],
                m["model"],
                m["dtype"],
                f"{m['checkpoint_mib']:.0f}",
                f"{m['hwm_loaded_mib']:.0f}",
                f"{m['hwm_warm_mib']:.0f}",
                f"{m['hwm_end_mib']:.0f}",
                f"{m['rss_anon_end_mib']:.0f}",
                f"{m['hwm_ratio']:.2f}x",
            ]
            for m in summary["memory"]
        ],
    )
    args = result["args"]
    head = [
        f"- command: `{env['command']}`",
        f"- {env['cpu']}; torch {env['versions']['torch']} ({env['torch_cpu_capability']}), "
        f"{env['torch_threads_per_shard']} threads per shard; Python {env['python']}; "
        f"git {env['git']['head']}{' (dirty tree)' if env['git']['dirty'] else ''}",
        f"- load average at start {_each(list(env['load_average_at_start']), '{:.2f}')}, "
        f"at end {_each(list(env.get('load_average_at_end', [])), '{:.2f}')}",
        f"- prompt {args['prompt_len']} tokens, {args['steps']} decode steps per case "
        f"(median step), {args['rounds']} interleaved rounds",
    ]
    shards = [
        f"- {p['pair']} {kind}: `{s['command']}`"
        for p in result["pairs"]
        for kind, s in p["shards"].items()
    ]
    return "\n".join([*head, "", decode, "", memory, "", "Shards:", *shards])
