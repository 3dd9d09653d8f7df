"""OLMo-Hybrid (AI2): Gated DeltaNet linear layers (three in four by default) beside OLMo 3's
softmax layers. The softmax layers are OLMo 2's (norms after attention and the MLP only, q and
k normed over the whole projection, float32 norms); the linear layers are pre-norm, as Qwen3.5's
are. Their Gated DeltaNet projects q, k, v, the output gate and the two per-head scalars apart
(q_proj ... g_proj, a_proj, b_proj), lets the write strength reach 2 (`linear_allow_neg_eigval`)
and norms its output with FLA's fixed epsilon. (transformers' model skips rotary without a
rope_theta, but its config always fills one in, 10000 by default, so every checkpoint rotates.)"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import nn

from shard.attention import AttentionBackend
from shard.layers.rotary import NoRotary, RotaryEmbedding
from shard.models.blocks import DecoderLayer, DecoderModel
from shard.models.config import LinearAttentionConfig, ModelConfig, UnsupportedArchitectureError
from shard.models.names import Names
from shard.models.olmo2 import OLMO2_NAMES, olmo2_layers
from shard.models.qwen3_5 import linear_attention_config
from shard.weights import Weights

_LINEAR = "model.layers.{i}.linear_attn."
# The released layout, which transformers renames on load and back on save: the linear layers'
# input norm is attention_layer_norm, and every layer's post_attention_layernorm (the linear
# layers' norm before the MLP, the softmax layers' after attention) is feedforward_layer_norm
OLMO_HYBRID_NAMES = {
    **OLMO2_NAMES,
    "input_layernorm": ("model.layers.{i}.attention_layer_norm",),
    "post_attention_layernorm": ("model.layers.{i}.feedforward_layer_norm",),
    "linear_q": (_LINEAR + "q_proj",),
    "linear_k": (_LINEAR + "k_proj",),
    "linear_v": (_LINEAR + "v_proj",),
    "linear_z": (_LINEAR + "g_proj",),
    "linear_b": (_LINEAR + "b_proj",),
    "linear_a": (_LINEAR + "a_proj",),
    "linear_conv": (_LINEAR + "q_conv1d", _LINEAR + "k_conv1d", _LINEAR + "v_conv1d"),
    "linear_dt_bias": (_LINEAR + "dt_bias",),
    "linear_a_log": (_LINEAR + "A_log",),
    "linear_norm": (_LINEAR + "o_norm",),
    "linear_out": (_LINEAR + "o_proj",),
}

# FusedRMSNormGated's default, which OLMo-Hybrid's output norm keeps whatever rms_norm_eps says
_OUTPUT_NORM_EPS = 1e-5


def _linear_config(raw: dict[str, Any], num_layers: int) -> LinearAttentionConfig:
    """config.json's linear_* fields, with transformers' defaults where a config leaves them out
    (every fourth layer softmax, heads as attention's, key dims 0.75 hidden / heads)."""
    heads = raw["num_attention_heads"]
    key_heads = raw.get("linear_num_key_heads") or heads
    key_dim = raw.get("linear_key_head_dim") or int(0.75 * raw["hidden_size"] / key_heads)
    filled = {
        "layer_types": raw.get("layer_types") or _default_layer_types(num_layers),
        "linear_num_key_heads": key_heads,
        "linear_num_value_heads": raw.get("linear_num_value_heads") or heads,
        "linear_key_head_dim": key_dim,
        "linear_value_head_dim": raw.get("linear_value_head_dim") or 2 * key_dim,
    }
    if filled["linear_num_value_heads"] != key_heads:
        # transformers' reference runs each value head with the key head of its own index, so
        # only equal counts are defined
        raise UnsupportedArchitectureError(
            f"OLMo-Hybrid with linear_num_value_heads {filled['linear_num_value_heads']} != "
            f"linear_num_key_heads {key_heads} is not supported"
        )
    cfg = linear_attention_config({**raw, **filled}, num_layers)
    beta_scale = 2.0 if raw.get("linear_allow_neg_eigval", True) else 1.0
    return replace(cfg, projections="separate", beta_scale=beta_scale, norm_eps=_OUTPUT_NORM_EPS)


def _default_layer_types(num_layers: int) -> list[str]:
    kinds = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(num_layers)]
    if "full_attention" not in kinds:
        kinds[-1] = "full_attention"
    return kinds


class OlmoHybridForCausalLM(DecoderModel):
    NAMES = OLMO_HYBRID_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        linear = _linear_config(raw, config.num_layers)
        return replace(olmo2_layers(config), linear_attention=linear)

    @classmethod
    def load_layer(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
    ) -> nn.Module:
        if config.linear(names.layer):  # pre-norm: an input norm, then one before the MLP
            config = replace(config, sandwich_norms=False, pre_norms=True)
        return DecoderLayer.load(weights, names, config, rotary, backend)
