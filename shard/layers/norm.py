"""RMSNorm as Llama computes it: statistics in float32, scale applied in the model dtype;
gpt-oss's (float32 throughout) and Gemma's (1 + w, float32 throughout); LayerNorms (Cohere's,
the GPT-style models' with a bias, Nemotron's 1 + w, OLMo's without weight). The platform's kernel
where it has one (shard/platforms/: on the CPU one native pass where torch takes six ops, on a
GPU one Triton kernel, the residual add included), else the torch form.

Given the residual stream too, the norm first adds it (`x + residual`, rounded to the dtype as
torch's add rounds) and returns both the normed sum and the sum, as vLLM's fused_add_rms_norm:
the decoder layer's residual adds then cost no call of their own (one native pass on the CPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shard.platforms import platform_of
from shard.weights import Weights


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps
        self.ops = platform_of(weight.device)

    @classmethod
    def load(cls, weights: Weights, prefix: str, eps: float) -> RMSNorm:
        return cls(weights.get_tensor(f"{prefix}.weight"), eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x); with `residual`, (norm(x + residual), x + residual)."""
        if residual is None:
            return self._norm(x)
        fused = self.ops.add_rms_norm(x, residual, self.weight, self.eps)
        if fused is not None:
            return fused
        summed = x + residual
        return self._norm(summed), summed

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        out = self.ops.rms_norm(x, self.weight, self.eps)
        if out is not None:
            return out
        # torch's fused kernel computes x * rsqrt(mean(x^2) + eps) in float32 and rounds once
        # to x's dtype, as Llama does before the scale (tests/shard/test_rmsnorm_rotary.py
        # checks it bit for bit); one op for what took six, 61 times a step.
        normed = F.rms_norm(x, (x.shape[-1],), eps=self.eps)
        # Scaling after the rounding matches the reference rounding in half precision.
        return self.weight * normed


class Fp32RMSNorm(RMSNorm):
    """x * rsqrt(mean(x^2) + eps) * w, all in float32 and rounded once to x's dtype, the weight
    kept in float32 (gpt-oss's RMSNorm; transformers keeps its norms in float32), where Llama
    rounds before scaling. A float32 model runs the shared kernels (the same math in one
    dtype); in half precision the weight's dtype differs from x's and every path takes the
    float32 form below."""

    @classmethod
    def load(cls, weights: Weights, prefix: str, eps: float) -> RMSNorm:
        return cls(weights.get_tensor(f"{prefix}.weight").float(), eps)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype:
            return super()._norm(x)
        return (F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps) * self.weight).to(x.dtype)


class GemmaRMSNorm(Fp32RMSNorm):
    """Gemma's RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), in float32 as Fp32RMSNorm
    (transformers' Gemma2RMSNorm / Gemma3RMSNorm).

    The checkpoint stores w; the layer keeps 1 + w in float32, computed once at load as the
    reference computes it per call, so the kernels that take a norm weight see the scale
    itself."""

    @classmethod
    def load(cls, weights: Weights, prefix: str, eps: float) -> RMSNorm:
        return cls(1.0 + weights.get_tensor(f"{prefix}.weight").float(), eps)


class LayerNorm(nn.Module):
    """(x - mean) * rsqrt(var + eps) * w + b. Not an RMSNorm: the platforms' RMS kernels (and
    the CPU decode loop's, which take RMSNorms only) never see it; torch's layer_norm serves
    every device. This kind (`"layer"`) is Cohere's: no bias, in float32 with the weight kept
    in float32, rounded once to x's dtype (transformers' CohereLayerNorm). The kinds below
    differ in what they load and in the dtype they compute in (`in_float32`)."""

    # computed in float32 and rounded once (Cohere's, OLMo's); False: torch's layer_norm in
    # x's dtype with the weight and bias in it, as torch.nn.LayerNorm computes it
    in_float32: bool = True

    def __init__(
        self, weight: torch.Tensor | None, eps: float, bias: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        self.weight = None if weight is None else nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.eps = eps

    @classmethod
    def load(cls, weights: Weights, prefix: str, eps: float) -> LayerNorm:
        return cls(weights.get_tensor(f"{prefix}.weight").float(), eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x); with `residual`, (norm(x + residual), x + residual)."""
        if residual is not None:
            summed = x + residual
            return self._norm(summed), summed
        return self._norm(x)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if not self.in_float32:
            return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
        normed = F.layer_norm(x.float(), (x.shape[-1],), eps=self.eps)
        if self.weight is not None:
            normed = normed * self.weight
        if self.bias is not None:
            normed = normed + self.bias
        return normed.to(x.dtype)


class BiasLayerNorm(LayerNorm):
    """torch.nn.LayerNorm as the GPT-style models hold it (StarCoder2, Phi, StableLM,
    GPT-NeoX): a weight and a bias in the model's dtype, torch's layer_norm in x's dtype (one
    rounding inside the kernel), the very op transformers calls."""

    in_float32 = False

    @classmethod
    def load(cls, weights: Weights, prefix: str, eps: float) -> LayerNorm:
        return cls(
            weights.get_tensor(f"{prefix}.weight"), eps, weights.get_tensor(f"{prefix}.bias")
        )


class LayerNorm1P(BiasLayerNorm):
    """Nemotron's LayerNorm1P: the checkpoint stores w and the norm scales by 1 + w, with a bias.
    transformers adds the 1 in the weight's dtype (the model's) on every call; the layer keeps
    that sum, computed once at load the same way, so torch's layer_norm sees the scale itself."""

    @classmethod
    def load(cls, weights: Weights, prefix: str, eps: float) -> LayerNorm:
        weight = weights.get_tensor(f"{prefix}.weight") + 1.0
        return cls(weight, eps, weights.get_tensor(f"{prefix}.bias"))


class WeightlessLayerNorm(LayerNorm):
    """OLMo (1)'s LayerNorm: neither weight nor bias, in float32 and rounded once (transformers'
    OlmoLayerNorm). Nothing is read."""

    @classmethod
    def load(cls, weights: Weights, prefix: str, eps: float) -> LayerNorm:
        return cls(None, eps)


# config's norm kind -> the layer (shard/models/config.py: ModelConfig.norm)
NORMS: dict[str, type[RMSNorm] | type[LayerNorm]] = {
    "rms": RMSNorm,
    "gemma_rms": GemmaRMSNorm,
    "fp32_rms": Fp32RMSNorm,
    "layer": LayerNorm,
    "layer_bias": BiasLayerNorm,
    "layer_1p": LayerNorm1P,
    "layer_weightless": WeightlessLayerNorm,
}


class ResidualAdd(nn.Module):
    """Where a layer has no norm before attention or the MLP (OLMo 2 norms their outputs
    instead): the stream enters as it is. Called as a norm is, with `residual` it returns the
    sum twice (the block's input and the stream)."""

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return x
        summed = x + residual
        return summed, summed
