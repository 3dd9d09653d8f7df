"""IBM Granite 4.0 (GraniteMoeHybridForCausalLM): granite-4.0-h-micro, -h-tiny and -h-small mix
Mamba 2 layers (shard/models/mamba_mixer.py) with a few softmax-attention ones (`layer_types`);
granite-4.0-micro has attention only. Every layer's MLP is the gated `shared_mlp` (its gate and
up fused in `input_linear`), with Mixture-of-Experts where the config names experts
(num_local_experts > 0), as Granite MoE Shared's. Granite's four multipliers apply
(shard/models/granite.py), and attention has no position encoding unless
`position_embedding_type` is "rope" (the -h models have none: the Mamba layers carry order).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.config import ModelConfig, UnsupportedArchitectureError
from shard.models.granite import GraniteForCausalLM
from shard.models.granite_moe import GraniteMoeSharedForCausalLM
from shard.models.mamba_mixer import MAMBA_NAMES, mamba_config
from shard.weights import Weights

# the dense models' MLP (the MoE models' shared expert: Granite MoE Shared's names)
_SHARED_MLP_AS_MLP = {
    "gate_up_proj": ("model.layers.{i}.shared_mlp.input_linear",),
    "down_proj": ("model.layers.{i}.shared_mlp.output_linear",),
}


class GraniteMoeHybridForCausalLM(GraniteMoeSharedForCausalLM):
    NAMES = {**GraniteMoeSharedForCausalLM.NAMES, **MAMBA_NAMES, **_SHARED_MLP_AS_MLP}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if raw.get("num_local_experts"):
            config = super().adapt_config(raw, config)
        else:  # dense: the shared MLP is every layer's MLP
            config = GraniteForCausalLM.adapt_config(raw, config)
            config = replace(config, intermediate_size=raw["shared_intermediate_size"])
        mamba = mamba_config(raw, raw.get("layer_types"), config)
        kind = raw.get("position_embedding_type")
        if kind not in (None, "rope"):
            raise UnsupportedArchitectureError(f"position_embedding_type {kind!r}")
        rotary = (kind == "rope",) * config.num_layers
        return replace(config, mamba=mamba, rotary_layers=rotary)

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        # the experts' names as Granite MoE's files or transformers 5 save them
        return {**super().names_for(weights), **MAMBA_NAMES, **_SHARED_MLP_AS_MLP}
