"""Dequantizing int4 codes in registers (a device function of the W4A16 GEMM, w4a16.py)."""

from __future__ import annotations

import triton
import triton.language as tl

EXPONENT_2P23 = 0x4B000000  # the fp32 bits of 2^23, the kernel's `exponent` argument


@triton.jit
def codes_minus_zeros(packed, zeros, exponent, BLOCK_K: tl.constexpr):
    """[BLOCK_N, BLOCK_K // 8] int32 words -> [BLOCK_N, BLOCK_K] fp32 (code - zero), exact.

    Code k is nibble j = k % 8 of word k // 8. Nibbles 4..7 are first moved down by one shift
    per word, so every code sits at bit 4j' (j' = j % 4) of a word: masking it in place under
    the exponent bits of 2^23 gives the float 2^23 + code * 2^(4j') (one LOP3), and
    fma(that, 2^-4j', -(2^(23-4j') + zero)) = code - zero exactly (one FFMA: every term is an
    integer below 2^24). The masks and powers of two are per-register constants once unrolled.
    `zeros` are integers (any shape broadcasting to the tile), turned into 2^23 + zero the same
    way, without an int-to-float conversion.

    `exponent` is 0x4B000000 (the bits of 2^23) passed at run time: as a literal, LLVM folds it
    into every per-code mask and ptxas then rematerialises it in a register for each LOP3
    (~5% more instructions in the loop, seen in the sm_90 SASS).
    """
    high = (packed.to(tl.uint32, bitcast=True) >> 16).to(tl.int32, bitcast=True)
    # Per word: low, low, low, low, high, high, high, high.
    words = tl.interleave(packed | exponent, high | exponent)
    words = tl.interleave(words, words)
    words = tl.interleave(words, words)
    nib = tl.arange(0, BLOCK_K) % 4
    in_place = (words & (exponent | (0xF << (nib * 4)))[None, :]).to(tl.float32, bitcast=True)
    down = ((127 - 4 * nib) << 23).to(tl.float32, bitcast=True)  # 2^-4j'
    offset = 8388608.0 - ((150 - 4 * nib) << 23).to(tl.float32, bitcast=True)  # 2^23 - 2^(23-4j')
    zero_2p23 = (zeros.to(tl.int32) | exponent).to(tl.float32, bitcast=True)  # 2^23 + zero
    return tl.fma(in_place, down[None, :], offset[None, :] - zero_2p23)
