"""Llama, Mistral, Qwen2 and Qwen3: one composition of the shared layers.

They differ only in configuration (biases, head_dim, rope scaling, sliding windows, Qwen3's
per-head query/key norms), which ModelConfig carries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from shard.attention import AttentionBackend, StepMetadata, attend, get_attention_backend
from shard.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from shard.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from shard.layers.norm import RMSNorm
from shard.layers.rotary import RotaryEmbedding
from shard.models.base import Architecture, CausalLM
from shard.models.config import ModelConfig
from shard.weights import Weights

# Our module names -> checkpoint prefixes ("{i}" = layer index). Fused modules map to several.
CHECKPOINT_NAMES: dict[str, tuple[str, ...]] = {
    "embed_tokens": ("model.embed_tokens",),
    "norm": ("model.norm",),
    "lm_head": ("lm_head",),
    "input_layernorm": ("model.layers.{i}.input_layernorm",),
    "post_attention_layernorm": ("model.layers.{i}.post_attention_layernorm",),
    "qkv_proj": (
        "model.layers.{i}.self_attn.q_proj",
        "model.layers.{i}.self_attn.k_proj",
        "model.layers.{i}.self_attn.v_proj",
    ),
    "o_proj": ("model.layers.{i}.self_attn.o_proj",),
    "q_norm": ("model.layers.{i}.self_attn.q_norm",),
    "k_norm": ("model.layers.{i}.self_attn.k_norm",),
    "gate_up_proj": ("model.layers.{i}.mlp.gate_proj", "model.layers.{i}.mlp.up_proj"),
    "down_proj": ("model.layers.{i}.mlp.down_proj",),
}


@dataclass(frozen=True)
class Names:
    """Resolves our names to checkpoint prefixes for one layer."""

    table: dict[str, tuple[str, ...]]
    layer: int = -1

    def many(self, ours: str) -> list[str]:
        return [name.format(i=self.layer) for name in self.table[ours]]

    def one(self, ours: str) -> str:
        (name,) = self.many(ours)
        return name


class LlamaAttention(nn.Module):
    def __init__(
        self,
        qkv_proj: QKVParallelLinear,
        o_proj: RowParallelLinear,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
        window: int | None = None,
        qk_norms: tuple[RMSNorm, RMSNorm] | None = None,
    ) -> None:
        super().__init__()
        self.qkv_proj = qkv_proj
        self.o_proj = o_proj
        # Qwen3: each head's query and key are RMS-normalised over head_dim before rotary.
        self.q_norm, self.k_norm = qk_norms or (None, None)
        self.rotary = rotary
        self.backend = backend
        self.scale = qkv_proj.head_dim**-0.5
        self.window = window  # sliding-window layer: attends to the last `window` positions

    @classmethod
    def load(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
    ) -> LlamaAttention:
        qkv = QKVParallelLinear.load_qkv(
            weights,
            names.many("qkv_proj"),
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            bias=config.qkv_bias,
        )
        o_proj = RowParallelLinear.load(weights, names.one("o_proj"), bias=config.o_bias)
        qk_norms = None
        if config.qk_norm:
            eps = config.rms_norm_eps
            qk_norms = (
                RMSNorm.load(weights, names.one("q_norm"), eps),
                RMSNorm.load(weights, names.one("k_norm"), eps),
            )
        return cls(qkv, o_proj, rotary, backend, config.layer_windows[names.layer], qk_norms)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: StepMetadata,
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        out = attend(self.backend, q, k, v, kv_cache, meta, self.scale, self.window)
        return self.o_proj(out.flatten(1))


class LlamaMLP(nn.Module):
    def __init__(self, gate_up_proj: MergedColumnParallelLinear, down_proj: RowParallelLinear):
        super().__init__()
        self.gate_up_proj = gate_up_proj
        self.down_proj = down_proj

    @classmethod
    def load(cls, weights: Weights, names: Names, config: ModelConfig) -> LlamaMLP:
        if config.hidden_act != "silu":
            raise ValueError(f"hidden_act {config.hidden_act!r} is not supported (only silu)")
        gate_up = MergedColumnParallelLinear.load_merged(
            weights, names.many("gate_up_proj"), bias=config.mlp_bias, num_blocks=2
        )
        down = RowParallelLinear.load(weights, names.one("down_proj"), bias=config.mlp_bias)
        return cls(gate_up, down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj.silu_and_mul(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        input_layernorm: RMSNorm,
        self_attn: LlamaAttention,
        post_attention_layernorm: RMSNorm,
        mlp: LlamaMLP,
    ) -> None:
        super().__init__()
        self.input_layernorm = input_layernorm
        self.self_attn = self_attn
        self.post_attention_layernorm = post_attention_layernorm
        self.mlp = mlp

    @classmethod
    def load(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
    ) -> LlamaDecoderLayer:
        eps = config.rms_norm_eps
        return cls(
            RMSNorm.load(weights, names.one("input_layernorm"), eps),
            LlamaAttention.load(weights, names, config, rotary, backend),
            RMSNorm.load(weights, names.one("post_attention_layernorm"), eps),
            LlamaMLP.load(weights, names, config),
        )

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: StepMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the MLP's output, the residual stream it is still to be added to): each layer's two
        residual adds happen in the norms after them (RMSNorm with `residual`), the last one in
        the model's final norm. `residual` is None at the first layer, whose input is the
        stream itself."""
        if residual is None:
            residual, x = hidden, self.input_layernorm(hidden)
        else:
            x, residual = self.input_layernorm(hidden, residual)
        x = self.self_attn(x, positions, kv_cache, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(CausalLM):
    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        super().__init__()
        names = Names(CHECKPOINT_NAMES)
        backend = get_attention_backend(attention)
        rotary = RotaryEmbedding(config.rope, weights.device)
        self.config = config
        self.embed_tokens = VocabParallelEmbedding.load(
            weights, f"{names.one('embed_tokens')}.weight", config.vocab_size
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer.load(weights, Names(CHECKPOINT_NAMES, i), config, rotary, backend)
            for i in range(config.num_layers)
        )
        self.norm = RMSNorm.load(weights, names.one("norm"), config.rms_norm_eps)
        lm_head = f"{names.one('lm_head')}.weight"
        if config.tie_word_embeddings:
            if weights.has(lm_head):  # some exports save the tied copy too; it is the same data
                weights.mark_consumed(lm_head)
            self.lm_head = ParallelLMHead.tied(self.embed_tokens)
        else:
            self.lm_head = ParallelLMHead.load(weights, lm_head, config.vocab_size)

        self.num_layers = config.num_layers
        self.num_kv_heads = self.layers[0].self_attn.qkv_proj.num_kv_heads if self.layers else 0
        self.head_dim = config.head_dim
        self.vocab_size = config.vocab_size
        self.max_position_embeddings = config.max_position_embeddings
        self.eos_token_ids = list(config.eos_token_ids)
        self.dtype = weights.dtype
        self.device = weights.device

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: StepMetadata,
    ) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(hidden, residual, positions, kv_cache, meta)
        return self.norm(hidden) if residual is None else self.norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


# Qwen2 configs have no attention_bias field, yet its q/k/v projections always carry a bias.
ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": Architecture(LlamaForCausalLM, qkv_bias_default=False),
    "MistralForCausalLM": Architecture(LlamaForCausalLM, qkv_bias_default=False),
    # Mistral with per-layer attention types (transformers loads a Mistral config that has
    # layer_types as Ministral, and so does this registry, through ModelConfig.layer_windows).
    "MinistralForCausalLM": Architecture(LlamaForCausalLM, qkv_bias_default=False),
    "Qwen2ForCausalLM": Architecture(LlamaForCausalLM, qkv_bias_default=True),
    "Qwen3ForCausalLM": Architecture(LlamaForCausalLM, qk_norm=True),
}
