"""Stores the new keys and values of a step into the paged KV cache, one token per program.

Cache layout [2, num_blocks, block_size, Hkv, D]; `slot = block * block_size + offset`. A negative
slot means "padding, store nothing" (what padded batches, e.g. under CUDA graphs, will need).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shard.platforms.cuda.kernels import check_device, head_block


@triton.jit
def _kv_write_kernel(
    key_ptr,
    value_ptr,
    cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_c_kv,
    stride_c_blk,
    stride_c_off,
    stride_c_h,
    stride_c_d,
    BLOCK_SIZE: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    # All heads of the token in one [BLOCK_H, BLOCK_D] tile: one program per token keeps the
    # grid small, and each row of the tile is a contiguous D-vector in both source and cache.
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
    dst = cache_ptr + block * stride_c_blk + offset * stride_c_off + h * stride_c_h + d * stride_c_d
    k = tl.load(key_ptr + token * stride_kt + h * stride_kh + d * stride_kd, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + h * stride_vh + d * stride_vd, mask=mask)
    tl.store(dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + stride_c_kv, v.to(cache_ptr.dtype.element_ty), mask=mask)


def kv_write(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """key/value [T, Hkv, D] (any strides) into kv_cache [2, num_blocks, block_size, Hkv, D]."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    check_device(key, value, kv_cache, slot_mapping)
    block_size = kv_cache.shape[2]
    _kv_write_kernel[(num_tokens,)](
        key,
        value,
        kv_cache,
        slot_mapping,
        *key.stride(),
        *value.stride(),
        *kv_cache.stride(),
        BLOCK_SIZE=block_size,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=head_block(head_dim),
    )
