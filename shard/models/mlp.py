"""The MLP blocks. `GatedMLP`: a fused gate_up product (two checkpoint tensors or one fused),
act(gate) * up with the activation from shard/layers/activation.py's table, the down projection;
dense layers' MLP, and Qwen2-MoE's shared expert (whose names carry the `shared_expert_` prefix).
`UngatedMLP` (`ModelConfig.gated_mlp` False): act(up) and the down projection (Arcee's ReLU^2;
Nemotron 3's shared expert)."""

from __future__ import annotations

import torch
from torch import nn

from shard.layers.linear import ColumnParallelLinear, MergedColumnParallelLinear, RowParallelLinear
from shard.models.config import ModelConfig
from shard.models.names import Names
from shard.platforms.activations import MLP_ACTIVATIONS
from shard.weights import Weights


class _DownProjected(nn.Module):
    """An MLP whose last step is the row-parallel down projection of `hidden(x)`."""

    down_proj: RowParallelLinear

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.hidden(x))

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's share of the output, before the all_reduce."""
        return self.down_proj.partial(self.hidden(x))


class GatedMLP(_DownProjected):
    def __init__(
        self, gate_up_proj: MergedColumnParallelLinear, down_proj: RowParallelLinear, act: str
    ) -> None:
        super().__init__()
        self.gate_up_proj = gate_up_proj
        self.down_proj = down_proj
        self.act = act  # a name of shard/layers/activation.py's GATED_ACTIVATIONS

    @classmethod
    def load(
        cls, weights: Weights, names: Names, config: ModelConfig, prefix: str = ""
    ) -> GatedMLP:
        """`prefix`: of our names in the table (`shared_expert_gate_up_proj`...)."""
        gate_up = MergedColumnParallelLinear.load_merged(
            weights, names.many(f"{prefix}gate_up_proj"), bias=config.mlp_bias, num_blocks=2
        )
        down = RowParallelLinear.load(
            weights, names.one(f"{prefix}down_proj"), bias=config.mlp_bias
        )
        return cls(gate_up, down, config.hidden_act)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate_up_proj.act_and_mul(x, self.act)


class UngatedMLP(_DownProjected):
    def __init__(
        self, up_proj: ColumnParallelLinear, down_proj: RowParallelLinear, act: str
    ) -> None:
        super().__init__()
        self.up_proj = up_proj
        self.down_proj = down_proj
        self.act = act  # a name of shard/platforms/activations.py's MLP_ACTIVATIONS

    @classmethod
    def load(
        cls, weights: Weights, names: Names, config: ModelConfig, prefix: str = ""
    ) -> UngatedMLP:
        """`prefix`: of our names in the table (Nemotron 3's `shared_expert_up_proj`...)."""
        up = ColumnParallelLinear.load(weights, names.one(f"{prefix}up_proj"), bias=config.mlp_bias)
        down = RowParallelLinear.load(
            weights, names.one(f"{prefix}down_proj"), bias=config.mlp_bias
        )
        return cls(up, down, config.hidden_act)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        return MLP_ACTIVATIONS[self.act](self.up_proj(x))
