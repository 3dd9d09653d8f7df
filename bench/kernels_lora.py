"""Multi-LoRA shrink + expand (one LoRA term of a layer) against the torch path's way of doing
it (a loop over the step's slots: gather the slot's tokens, two matmuls, scatter-add), for
bench/kernels.py.

Shapes: Llama-3-8B's fused q/k/v (K 4096, slices 4096/1024/1024), fused gate/up (K 4096, slices
14336/14336) and down_proj (K 14336, N 4096), rank 16, 8 slots, bf16; decode steps of 1, 16, 64
and 256 tokens spread over the slots (some without an adapter) and a prefill of 8192 tokens in 4
same-slot segments. The step's tile grouping is built once outside the timed call, as a step
shares it across layers. Bandwidth
counts what must move: the A and B of the slots in use, x, y read and written, and h. The note
gives the time of the base layer's own matmul (x @ W^T, cuBLAS) and the LoRA term's time as a
share of it: what an adapter adds to the layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from bench.kernel_report import Result, graph_note

LAYERS = {
    "qkv": (4096, (4096, 1024, 1024)),
    "gate_up": (4096, (14336, 14336)),
    "down": (14336, (4096,)),
}
RANK, SLOTS = 16, 8
STEPS = {
    "decode T=1": (1, 1),
    "decode T=16": (16, 16),
    "decode T=64": (64, 64),
    "decode T=256": (256, 256),
    "prefill T=8192": (8192, 4),
}
SMOKE_LAYERS = {"qkv": (72, (40, 9, 23)), "down": (100, (24,))}
SMOKE_STEPS = {"decode T=1": (1, 1), "decode T=7": (7, 7), "prefill T=40": (40, 3)}


def step_slots(tokens: int, runs: int, gen: torch.Generator) -> torch.Tensor:
    """`runs` equal runs of consecutive tokens (one token each for decode), each with a random
    slot or -1 (no adapter)."""
    per_run = -(-tokens // runs)
    run_slots = torch.randint(-1, SLOTS, (runs,), generator=gen)
    if tokens == 1:
        run_slots[0] = 0  # a lone token without an adapter would time an empty launch
    return run_slots.repeat_interleave(per_run)[:tokens].to(torch.int32)


def torch_lora(x, a, b, scales: list[float], slots_host: list[int], token_slots, out_slices, y):
    """The torch path: per slot in use, its tokens' h = x A^T and y += s h B^T, slice by slice."""
    n_sub, rank = a.shape[1], a.shape[2]
    for s in sorted(set(slots_host) - {-1}):
        idx = (token_slots == s).nonzero().squeeze(1)
        h = (x[idx] @ a[s].reshape(n_sub * rank, -1).T).view(-1, n_sub, rank)
        start = 0
        for j, size in enumerate(out_slices):
            term = h[:, j] @ b[s, start : start + size].T
            y[idx, start : start + size] += scales[s] * term
            start += size


@dataclass(frozen=True)
class Layer:
    name: str
    out_slices: tuple[int, ...]
    a: torch.Tensor  # [SLOTS, n_sub, RANK, K]
    b: torch.Tensor  # [SLOTS, N, RANK]
    scales: list[float]
    scaling: torch.Tensor
    weight: torch.Tensor  # the base layer's [N, K], for its matmul's time


def make_layer(name: str, k: int, out_slices: tuple[int, ...], device, gen) -> Layer:
    dtype = torch.bfloat16
    n, n_sub = sum(out_slices), len(out_slices)
    a = (torch.randn(SLOTS, n_sub, RANK, k, generator=gen) / k**0.5).to(dtype).to(device)
    b = (torch.randn(SLOTS, n, RANK, generator=gen) / RANK**0.5).to(dtype).to(device)
    scales = (torch.rand(SLOTS, generator=gen) + 0.5).tolist()
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(device)
    return Layer(name, out_slices, a, b, scales, torch.tensor(scales, device=device), weight)


def bench_step(bench, layer: Layer, step: str, tokens: int, runs: int, gen) -> Result:
    from shard.platforms.cuda.kernels.lora_expand import lora_expand
    from shard.platforms.cuda.kernels.lora_shrink import lora_shrink
    from shard.platforms.cuda.kernels.lora_tiles import default_block_m, slot_tiles

    device, (n, k) = layer.a.device, layer.weight.shape
    n_sub = len(layer.out_slices)
    slots_host = step_slots(tokens, runs, gen)
    slots = slots_host.tolist()
    token_slots = slots_host.to(device)
    x = torch.randn(tokens, k, generator=gen).to(layer.a.dtype).to(device)
    y0 = torch.randn(tokens, n, generator=gen).to(layer.a.dtype).to(device)
    y = y0.clone()  # the timed calls accumulate into it; only their time counts
    tiles = slot_tiles(token_slots, SLOTS, default_block_m(tokens))

    def ours(y: torch.Tensor = y) -> torch.Tensor:
        h = lora_shrink(x, layer.a, token_slots, tiles=tiles)
        lora_expand(h, layer.b, token_slots, layer.scaling, layer.out_slices, y, tiles=tiles)
        return y

    def baseline() -> None:
        torch_lora(x, layer.a, layer.b, layer.scales, slots, token_slots, layer.out_slices, y)

    used = len(set(slots) - {-1})
    adapter_bytes = used * (n_sub * RANK * k + n * RANK) * x.element_size()
    # + x, y read and written, h written and read (fp32)
    work = adapter_bytes + tokens * ((k + 2 * n) * x.element_size() + 8 * n_sub * RANK)
    row = Result(f"lora {layer.name} {step} slots={used}", bench(ours), work, "TB/s")
    row.baseline_ms = bench(baseline)
    row.flops = 2.0 * tokens * RANK * (n_sub * k + n)
    expected = y0.float()
    a, b = layer.a.float(), layer.b.float()
    torch_lora(x.float(), a, b, layer.scales, slots, token_slots, layer.out_slices, expected)
    row.max_err = (ours(y0.clone()).float() - expected).abs().max().item()

    def base() -> torch.Tensor:
        return x @ layer.weight.T

    base_ms = bench(base)
    row.note = (
        f"vs torch per-slot loop; base x@W {base_ms:.3f} ms, lora/base {row.ms / base_ms:.2f}"
        + graph_note(ours, base)
    )
    return row


def bench_lora(
    bench: Callable[[Callable[[], object]], float], device: torch.device, smoke: bool
) -> list[Result]:
    gen = torch.Generator().manual_seed(0)
    results = []
    for name, (k, out_slices) in (SMOKE_LAYERS if smoke else LAYERS).items():
        layer = make_layer(name, k, out_slices, device, gen)
        for step, (tokens, runs) in (SMOKE_STEPS if smoke else STEPS).items():
            results.append(bench_step(bench, layer, step, tokens, runs, gen))
    return results
