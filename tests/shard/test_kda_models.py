"""Kimi Linear's and Ling's tiny checkpoints (Kimi Delta Attention beside latent attention):
what the comparisons with transformers (test_models_vs_transformers.py, test_cpu_decode.py,
test_tensor_parallel.py, test_chunked_prefill.py) rely on.

- the KDA state matters in transformers' own run of the checkpoints: zeroing it before the last
  token moves the logits by far more than any tolerance there (launcher/tiny_models.py spreads
  the forget gates' A_log and dt_bias so that some channels remember the whole prompt);
- each layer is served by the mixer meant for it, Kimi's latent attention never turned, Ling's
  convs kept in float32 in a bfloat16 model;
- a shard count that does not divide the KDA heads is refused at load, naming them.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from shard.distributed import Distributed
from shard.models import load_model
from shard.models.config import KdaConfig
from shard.models.gated_latent_attention import GatedLatentAttention
from shard.models.kda_mixer import KimiDeltaAttention
from shard.models.kimi_linear import UnturnedRotary
from shard.models.latent_attention import LatentAttention
from shard.weights import WeightsError

CASES = ["kimi_linear_kda_nope_mla", "bailing_hybrid_kda_gated_mla"]
CPU = torch.device("cpu")


@pytest.mark.parametrize("name", CASES)
def test_dropping_the_kda_state_moves_transformers_logits(tiny_model, name):
    model = AutoModelForCausalLM.from_pretrained(tiny_model(name), dtype=torch.float32).eval()
    ids = (torch.arange(30) * 37 % 500 + 3)[None]
    linear = [i for i, kind in enumerate(model.config.layer_types) if kind == "linear_attention"]

    def last_logits(drop_state: bool) -> torch.Tensor:
        with torch.inference_mode():
            cache = model(ids[:, :-1], use_cache=True).cache
            if drop_state:
                for layer in linear:
                    cache.get_recurrent_state(layer, state_idx=0).zero_()
            return model(ids[:, -1:], cache=cache).logits[0, -1]

    assert (last_logits(False) - last_logits(True)).abs().max() > 0.5


@pytest.mark.parametrize("name", CASES)
def test_each_layer_has_its_mixer(tiny_model, name):
    model = load_model(tiny_model(name), dtype=torch.bfloat16, device=CPU, dist=Distributed())
    kda, attention, _ = model.mixers
    assert isinstance(kda, KimiDeltaAttention) and isinstance(_, KimiDeltaAttention)
    assert isinstance(attention, LatentAttention) and model.recurrent
    if name.startswith("kimi"):
        assert isinstance(attention.rotary, UnturnedRotary)  # NoPE, the rope part kept
        assert kda.f_up is not None and kda.kda.gate == "softplus"
        assert kda.conv_weight.dtype == torch.bfloat16
    else:
        assert isinstance(attention, GatedLatentAttention)
        assert kda.f_up is None and kda.kda.gate == "bounded" and kda.kda.decay_in_model_dtype
        assert kda.conv_weight.dtype == torch.float32  # kept so, as transformers keeps it


def test_a_shard_count_not_dividing_the_kda_heads_is_refused(tiny_model):
    with pytest.raises(WeightsError, match="3 shards cannot split the 4 Kimi Delta Attention"):
        load_model(
            tiny_model("kimi_linear_kda_nope_mla"),
            dtype=torch.float32,
            device=CPU,
            dist=Distributed(rank=0, world_size=3),
        )


@pytest.mark.parametrize("rounded", [True, False])
def test_ling_rounds_its_log_decays_to_the_model_dtype(rounded):
    """transformers' BailingHybridForgetGate returns g in the model's dtype (Kimi's keeps float32):
    in bfloat16 every decay is a bfloat16 value; unrounded, most are not."""
    gate = SimpleNamespace(
        dt_bias=torch.linspace(-5, -1, 8).view(2, 4),
        decay_rate=torch.tensor([[0.5], [2.0]]),
        kda=KdaConfig((True,), 2, 4, 4, gate="bounded", decay_in_model_dtype=rounded),
    )
    f = torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(0)).bfloat16()
    g = KimiDeltaAttention.log_decay(gate, f)  # type: ignore[arg-type]
    assert g.dtype == torch.float32
    assert torch.equal(g, g.bfloat16().float()) == rounded
