"""Pure Mamba 2 language models (`Mamba2ForCausalLM`: Mistral's Codestral Mamba 7B,
state-spaces' mamba2-130m to -2.7b): every layer NemotronH's one-module block (a norm, then a
Mamba 2 mixer, shard/models/mamba_mixer.py, whose output joins the stream) under the same
`backbone.` names, no attention and no MLP. The stream between the blocks is kept in float32
(`residual_in_fp32`, true by default), each block's norm reading it in the model's dtype, as
transformers' Mamba2Block does. The model has no position limit of its own: it serves
`max_position_embeddings` where the config gives one, else MAX_POSITIONS."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from shard.attention import StepMetadata
from shard.models.config import MambaConfig, ModelConfig
from shard.models.mamba_mixer import checked
from shard.models.nemotron_h import NemotronHForCausalLM

# The positions a model without a limit of its own serves (the router's limits still apply).
MAX_POSITIONS = 131072


class Mamba2ForCausalLM(NemotronHForCausalLM):
    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **kwargs: Any) -> ModelConfig:
        layers = int(raw["num_hidden_layers"])
        raw = {
            **raw,
            # no attention anywhere: the Llama-shaped fields ModelConfig reads, unused
            "num_attention_heads": 1,
            "head_dim": int(raw["head_dim"]),
            "intermediate_size": 0,
            "max_position_embeddings": raw.get("max_position_embeddings") or MAX_POSITIONS,
            "layers_block_type": ["mamba"] * layers,
        }
        return super().config_from_dict(raw, **kwargs)

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        limit = raw.get("time_step_limit") or (0.0, float("inf"))
        mamba = MambaConfig(
            layers=(True,) * config.num_layers,
            num_heads=int(raw["num_heads"]),
            head_dim=int(raw["head_dim"]),
            num_groups=int(raw.get("n_groups") or 1),
            state_size=int(raw["state_size"]),
            conv_kernel=int(raw.get("conv_kernel") or 4),
            conv_bias=bool(raw.get("use_conv_bias", True)),
            proj_bias=bool(raw.get("use_bias", False)),
            time_step_limit=(float(limit[0]), float(limit[1])),
        )
        return replace(
            config,
            norm="rms",  # Llama's: the weight times the normed input rounded to its dtype
            rms_norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
            mamba=checked(mamba, raw.get("hidden_act", "silu")),
            rotary_layers=(False,) * config.num_layers,
            mlp_layers=(False,) * config.num_layers,
            moe=None,
            residual_in_float32=bool(raw.get("residual_in_fp32", True)),
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: StepMetadata,
    ) -> torch.Tensor:
        stream = self.embed(input_ids, positions)
        wide = self.config.residual_in_float32
        for layer, state in zip(self.layers, kv_caches, strict=True):
            mixed = layer.self_attn(layer.norm(stream.to(self.dtype)), positions, state, meta)
            stream = (stream.float() if wide else stream) + mixed
        # (float32 through the final norm, then the head's dtype: transformers' order)
        return self.norm(stream).to(self.dtype)
