"""Counter-based randomness for sampling: uniforms are a hash of (seed, step, token id).

A stateful generator would make a request's draws depend on which requests shared its batch
and in what order; a hash of coordinates gives every (request, step, token) its own fixed
uniform, identical on every tensor-parallel rank and under any batch composition.

Values are 32-bit words held in int64 tensors (torch has no uint32 arithmetic). Every
product stays inside int64 (see `_mul32`), so no step relies on signed overflow.
"""

from functools import lru_cache

import torch
from torch import Tensor

MASK32 = 0xFFFF_FFFF
# Counters for per-row draws that belong to no token (token ids never reach 2**32 - 2): which
# part of the distribution a row draws from, and where in the tail's cumulative distribution.
ROW_COUNTER = MASK32
TAIL_COUNTER = MASK32 - 1

_TWO32 = 1 << 32
_GOLDEN = 0x9E37_79B9  # 2**32 / phi: spreads consecutive token ids over the word
_FMIX_M1 = 0x85EB_CA6B  # murmur3 fmix32 multipliers
_FMIX_M2 = 0xC2B2_AE35
# Distinct salts per key word, so that (lo, hi, step) = (a, b, c) and permutations differ.
_SALT_LO = 0x6A09_E667
_SALT_HI = 0xBB67_AE85
_SALT_STEP = 0x3C6E_F372


def _signed(m: int) -> int:
    """The multiplier congruent to m mod 2**32 with |m| < 2**31.

    For x in [0, 2**32) this keeps |x * m| < 2**63, so the int64 product is exact and
    masking it keeps the low word.
    """
    return m - _TWO32 if m >= 1 << 31 else m


def _mul32_(x: Tensor, m: int) -> Tensor:
    """In place: x = (x * m) mod 2**32."""
    return x.mul_(_signed(m)).bitwise_and_(MASK32)


def _fmix32_(x: Tensor) -> Tensor:
    """murmur3's 32-bit finalizer, in place (the full-vocabulary path runs it on [rows, V])."""
    x.bitwise_xor_(x >> 16)
    _mul32_(x, _FMIX_M1)
    x.bitwise_xor_(x >> 13)
    _mul32_(x, _FMIX_M2)
    return x.bitwise_xor_(x >> 16)


def fmix32(x: Tensor) -> Tensor:
    """murmur3's 32-bit finalizer: a bijection on [0, 2**32) with full avalanche."""
    return _fmix32_(x.clone())


def split_seed(seed: int) -> tuple[int, int]:
    """A seed of any size as the (low, high) 32-bit words of its value modulo 2**64."""
    seed &= (1 << 64) - 1
    return seed & MASK32, seed >> 32


def stream_keys(seed_lo: Tensor, seed_hi: Tensor, step: Tensor) -> Tensor:
    """One 32-bit key per row from its seed words and step counter (all int64, same shape)."""
    h = _fmix32_(seed_lo ^ _SALT_LO)
    h = _fmix32_(h ^ seed_hi ^ _SALT_HI)
    return _fmix32_(h ^ (step & MASK32) ^ _SALT_STEP)


def token_codes(ids: Tensor) -> Tensor:
    """Mixed 32-bit code of each token id (int64 in [0, 2**32))."""
    return _fmix32_(_mul32_(ids.to(torch.int64, copy=True), _GOLDEN))


@lru_cache(maxsize=8)
def vocab_codes(vocab_size: int, device: torch.device) -> Tensor:
    """token_codes of 0..vocab_size-1, cached: the full-vocabulary path needs them every step."""
    return token_codes(torch.arange(vocab_size, dtype=torch.int64, device=device))


def hash_bits(keys: Tensor, codes: Tensor) -> Tensor:
    """32 random bits per (key, code) pair; keys and codes broadcast against each other."""
    return _fmix32_(keys ^ codes)


def uniform(keys: Tensor, codes: Tensor) -> Tensor:
    """float32 uniforms in (0, 1): 23 bits plus a half step, so both ends stay out of reach
    (24 bits + 0.5 would round the top value to exactly 1.0 in float32)."""
    bits = hash_bits(keys, codes).bitwise_right_shift_(9)
    return bits.to(torch.float32).add_(0.5).mul_(2.0**-23)


def uniform64(keys: Tensor, codes: Tensor) -> Tensor:
    """float64 uniforms in (0, 1) from all 32 bits, for the few per-row draws."""
    return hash_bits(keys, codes).to(torch.float64).add_(0.5).mul_(2.0**-32)


def gumbel(keys: Tensor, codes: Tensor) -> Tensor:
    """Standard Gumbel noise, float32: argmax(logits + gumbel) samples softmax(logits)."""
    return uniform(keys, codes).log_().neg_().log_().neg_()
