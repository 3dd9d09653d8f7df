"""MXFP4 (OCP microscaling FP4), as gpt-oss's checkpoints store their experts: each block of 32
weights along the input dimension is 16 bytes of e2m1 codes (two 4-bit codes a byte, the low
nibble first) and one e8m0 scale byte (2^(byte - 127)). `<name>_blocks` [..., out, in/32, 16]
uint8 and `<name>_scales` [..., out, in/32] uint8, the output dimension before the input one.

Served by dequantizing once at load to the model's dtype: no MXFP4 kernel runs here, so the
experts cost what the unquantized model's do (transformers does the same where it has none)."""

from __future__ import annotations

import torch

BLOCK = 32  # weights a scale covers
# e2m1's sixteen values by code: sign bit, two exponent bits, one mantissa bit
E2M1_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)
SCALE_BIAS = 127
CHUNK_BLOCKS = 1 << 20  # blocks dequantized at once: ~80 MiB of transient indices and values


def dequantize_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """blocks [..., G, 16] uint8, scales [..., G] uint8 -> weights [..., G * 32] in `dtype`.

    In chunks of CHUNK_BLOCKS blocks: the codes' table indices and the float32 values of a
    whole gpt-oss-120b expert tensor at once would be ~20 bytes a weight of transient memory,
    on the device the weights load to."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BLOCK // 2:
        raise ValueError(
            f"MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} do not match "
            f"(blocks [..., G, {BLOCK // 2}], scales [..., G])"
        )
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    flat_blocks = blocks.reshape(-1, BLOCK // 2)
    flat_scales = scales.reshape(-1)
    out = torch.empty(flat_blocks.shape[0], BLOCK, dtype=dtype, device=blocks.device)
    for start in range(0, flat_blocks.shape[0], CHUNK_BLOCKS):
        stop = min(start + CHUNK_BLOCKS, flat_blocks.shape[0])
        codes = flat_blocks[start:stop].to(torch.uint8)
        # [n, 16, 2]: each byte's low code, then its high one
        pairs = torch.stack([codes & 0x0F, codes >> 4], dim=-1).to(torch.long)
        values = lut[pairs].flatten(-2)  # [n, 32]
        exponents = (flat_scales[start:stop].to(torch.int32) - SCALE_BIAS).to(torch.float32)
        out[start:stop] = torch.ldexp(values, exponents[:, None])
    return out.reshape(*scales.shape[:-1], scales.shape[-1] * BLOCK)
