"""PEFT adapters on the architectures beyond the Llama family, against transformers + peft
alone (float32): greedy ids equal, logprobs within 1e-4, several adapters and the base model in
one batch, whole and chunked prompts; and bf16 serving on Phi-3 (as test_lora_bf16_vs_peft.py).

- Gemma 2 has Llama's module names; its gate_up term goes through GeGLU (gelu-tanh) and its
  attention and final logits are soft-capped. Gemma 3 the same, with q/k norms after the q/k
  terms and one KV head.
- Gemma 3's vision-language checkpoint nests the LM's names; its adapters name it otherwise
  and carry vision-tower modules, which the text-only server leaves out.
- gpt-oss: adapters on its attention (sinks, biases); its Mixture-of-Experts MLP untouched.
- DeepSeek-V3: adapters on the latent attention's projections, except kv_b_proj (refused: it
  is absorbed into the query and the output).
- OLMo 2: q/k terms normed with the products over the whole projection, o/down terms before
  the post norms. Granite: o/down terms scaled with the products (residual_multiplier).
- Phi-3's checkpoint fuses q/k/v into one qkv_proj and gate/up into one gate_up_proj tensor,
  and PEFT targets those fused modules: one A each, B split like the weight's rows
  (lora_fixtures.PHI3_ADAPTERS: all linears, each fused module alone, the row layers alone).
"""

from __future__ import annotations

import json

import pytest
import torch
from lora_fixtures import ADAPTERS, ALL, PHI3_ADAPTERS, PHI3_ALL, make_adapter, peft_reference
from transformers import AutoModelForCausalLM

from shard.distributed import Distributed
from shard.lora.adapter import AdapterError
from shard.lora.manager import LoraManager, LoraSettings
from shard.models import load_model
from shard.models.linear_attention import RecurrentMixer
from tests.shard.servicer_helpers import prompts
from tests.shard.test_lora_vs_peft import LOGPROB_ATOL, NEW_TOKENS, lora_service, serve_mixed

CPU = torch.device("cpu")
# model -> the adapters served on it
CASES = {
    "gemma2_softcap_alternating": ADAPTERS,
    "gemma3_qk_norm_local_rope": ADAPTERS,
    "phi3_partial_longrope": PHI3_ADAPTERS,
    # q/k terms before OLMo 2's whole-projection q/k norms; o/down terms before its post norms
    "olmo2_projection_qk_norm": ADAPTERS,
    # o/down terms scaled with the products by Granite's residual_multiplier
    "granite_multipliers": ADAPTERS,
    # Cohere 2: attention's and the MLP's terms on one normed input, added to the stream apart
    "cohere2_sliding_nope": ADAPTERS,
    # Arcee: up_proj's term before the ungated relu^2, down_proj's after it
    "arcee_relu2_ungated_yarn": {
        "qv_r4": ADAPTERS["qv_r4"],
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    # Phi: attention's and the MLP's terms on one normed input, their outputs summed; fc1's term
    # before gelu_new, the biased head without one
    "phi_parallel_head_bias": {
        "qv_r4": ADAPTERS["qv_r4"],
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    # Gemma 3 as released (vision-language, served text only): PEFT's adapters name the LM's
    # modules as transformers 5 does (`model.language_model...`), unlike the Hub's files, and
    # these also adapt the vision tower (its q/v_proj; all-linear: its fc1, fc2, out_proj too),
    # which text never reaches.
    "gemma3_vision_language": {
        "qv_r4": ADAPTERS["qv_r4"],
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    # gpt-oss: attention with sinks and biases under the adapters' terms; its experts are
    # parameters, not linears, so all-linear adapts q/k/v/o only.
    "gpt_oss_sinks_clamped": {
        "qv_r4": ADAPTERS["qv_r4"],
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    # DeepSeek-V3's latent attention: terms on the query's bottleneck (q_a_proj, whole on every
    # rank) and its heads (q_b_proj), on the latent's projection and on o_proj (PEFT turns MLP
    # targets into terms on the routed experts' parameters, which are refused)
    # Granite 4.0-H: all-linear adds terms on the Mamba layers' in_proj (its z, x, B, C and dt
    # rows in one product, each rank its own) and out_proj, and on the shared MLP's fused
    # input_linear
    "granite4_hybrid_dense_nope": {
        "qv_r4": ADAPTERS["qv_r4"],
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    # Qwen3.5: q_proj's terms on each head's query and its output gate alike; all-linear adds
    # terms on linear attention's projections (q/k/v with z in one product, b with a, out_proj)
    "qwen3_5_linear_attention": {
        "qv_r4": ADAPTERS["qv_r4"],
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    # OLMo-Hybrid: q_proj and v_proj name both kinds of layer's projections (the linear layers'
    # terms on their q and v rows of one product); all-linear adds k, the gate, b, a, o_proj
    "olmo_hybrid_delta_post_norm": {
        "qv_r4": ADAPTERS["qv_r4"],
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    # Gemma 4 (E2B's shape): the KV-sharing layers' q terms over their sources' keys; all-linear
    # adds terms on the per-layer embeddings' projection (whole on every rank) and each layer's
    # gate and projection of them
    "gemma4_per_layer_inputs_kv_sharing": {
        "qv_r4": ADAPTERS["qv_r4"],
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    # Gemma 3n: q/v terms on the active stream's attention (the KV-sharing layers' q over their
    # sources' keys); then Laurel's, the stream projections', the per-layer inputs' and the
    # (sparse) MLPs' (AltUp's coefficient projections take none: refused by name)
    "gemma3n_altup_laurel_sparse": {
        "qv_r4": ADAPTERS["qv_r4"],
        "linears_r8": dict(
            r=8,
            lora_alpha=16,
            target_modules=[
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
                "linear_left",
                "linear_right",
                "altup_projections.0",
                "altup_unembed_projections.2",
                "per_layer_input_gate",
                "per_layer_projection",
                "per_layer_model_projection",
            ],
        ),
    },
    # Gemma 4 (31B's shape): a k_proj term reaches the global layers' values too (their values
    # are k_proj's output)
    "gemma4_keys_as_values": {
        "kv_r4": dict(r=4, lora_alpha=8, target_modules=["k_proj", "v_proj"]),
    },
    # StarCoder (GPTBigCode): PEFT's terms on the fused c_attn (its B's rows split as the
    # weight's: q rows, then the one KV head's k and v; by head without multi_query), on both
    # c_proj (attention's and the MLP's) and on c_fc before gelu-tanh
    "gpt_bigcode_multi_query": {
        "c_attn_r4": dict(r=4, lora_alpha=8, target_modules=["c_attn"]),
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    "gpt_bigcode_per_head_qkv": {
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    # Apertus: up_proj's term before each layer's xIELU, down_proj's after it
    "apertus_xielu_qk_norm": {
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    # Falcon's query_key_value grouped by KV head: the term's B rows picked as the weight's
    "falcon_grouped_two_norms": {
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    # GPT-2: PEFT's terms on its Conv1D modules (fan_in_fan_out), c_attn's B rows [q | k | v]
    "gpt2_conv1d": {
        "c_attn_r4": dict(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True),
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    # OPT: PEFT's classic q/v adapter, and every linear (fc1's term before the ReLU)
    "opt_learned_positions": {
        "qv_r4": ADAPTERS["qv_r4"],
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    # Falcon-H1: terms on the Mamba mixer's in_proj (its rows scaled per part after the term)
    # beside attention's and the MLP's (the gate's term before its multiplier); PEFT refuses
    # out_proj on Mamba models
    "falcon_h1_gate_before_norm": {
        "linears_r8": dict(
            r=8,
            lora_alpha=16,
            target_modules=[
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "in_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ],
        ),
    },
    # LFM3: the gate's term (a gate a head) beside attention's, the convolutions' and the MLP's
    "lfm3_gated_sliding_sandwich": {
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    # LFM2: terms on the short convolutions' in_proj (B, C and x rows) and out_proj beside
    # attention's and the MLP's (w1, w3 before SwiGLU, w2 after)
    "lfm2_short_conv_hybrid": {
        "all_linear_r8": dict(r=8, lora_alpha=16, target_modules="all-linear"),
    },
    "deepseek_v3_mla": {
        "latent_r4": dict(
            r=4, lora_alpha=8, target_modules=["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa"]
        ),
        "o_r8": dict(r=8, lora_alpha=16, target_modules=["o_proj"]),
    },
}


@pytest.fixture(scope="module", params=list(CASES))
def setup(request, tiny_model, tmp_path_factory):
    """The model's name, its adapters (name -> dir), a servicer with all of them, and the
    references (name -> model, "" the base), each loaded once for the module's tests."""
    base = tiny_model(request.param)
    root = tmp_path_factory.mktemp("adapters")
    configs = CASES[request.param]
    adapters = {
        name: make_adapter(base, root / name, seed=40 + i, **config)
        for i, (name, config) in enumerate(configs.items())
    }
    service = lora_service(base, adapters, max_loras=len(adapters))
    references = {name: peft_reference(base, path) for name, path in adapters.items()}
    references[""] = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    return request.param, adapters, service, references


def _greedy(model, prompt: list[int]) -> tuple[list[int], list[float]]:
    """Greedy ids and logprobs, the whole sequence recomputed each step as test_lora_vs_peft's
    reference does. For Phi-3's longrope that is what the shard serves too: a sequence that
    grows past original_max_position_embeddings is recomputed whole with the long factors
    (shard/runner.py), and one of the prompts here (29 tokens) crosses the 32-token boundary."""
    ids = list(prompt)
    logprobs = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
    return ids[len(prompt) :], logprobs


@pytest.mark.parametrize("chunked", [False, True])
def test_adapters_mixed_with_the_base_model_equal_peft_alone(setup, chunked):
    _, adapters, service, references = setup
    first = next(iter(adapters))
    names = ["", *adapters, first]  # the base model, every adapter, one adapter twice
    texts, got = serve_mixed(service, names, seed=3, chunk=7 if chunked else None)
    for i, (name, prompt) in enumerate(zip(names, texts, strict=True)):
        want_ids, want_lps = _greedy(references[name], prompt)
        assert [t for t, _ in got[i][:NEW_TOKENS]] == want_ids, f"request {i} ({name or 'base'})"
        lps = torch.tensor([lp for _, lp in got[i][:NEW_TOKENS]])
        torch.testing.assert_close(lps, torch.tensor(want_lps), atol=LOGPROB_ATOL, rtol=0)


def test_every_adapter_changes_the_output(setup):
    """Guards the test above against adapters too weak to matter: each target set, the fused
    modules alone included, moves the logprobs."""
    _, adapters, _, references = setup
    prompt = [3 + t % 300 for t in prompts(1, seed=9)[0]]
    plain = _greedy(references[""], prompt)[1]
    for name in adapters:
        assert _greedy(references[name], prompt)[1] != pytest.approx(plain, abs=1e-3), name


def test_the_fused_terms_have_one_sub_module_per_checkpoint_module(setup):
    """Phi-3's fused q/k/v and gate/up are one sub-module each (their adapter's one A shrinks
    once), as GPTBigCode's c_attn is; Gemma's come from three and two tensors, as Llama's
    (gpt-oss's MLP is experts only: no gate_up term)."""
    model, _, service, _ = setup
    # the first layer that attends (Qwen3.5's and Granite 4.0-H's first are recurrent)
    layers = service.runner.model.layers
    layer = next(x for x in layers if not isinstance(x.self_attn, RecurrentMixer))
    if model.startswith("deepseek"):  # latent attention: each projection is its own module
        attention = layer.self_attn
        q_a_proj, _, q_b_proj = attention.q_proj
        assert [len(m.lora.out_slices) for m in (q_a_proj, q_b_proj, attention.kv_a_proj)] == [
            1,
            1,
            1,
        ]
        return
    qkv = layer.self_attn.qkv_proj.lora
    falcon = model.startswith("falcon_") and not model.startswith("falcon_h1")  # not Falcon-H1
    fused = falcon or model.startswith(("phi3", "gpt_bigcode", "gpt2"))  # c_attn, query_key_value
    assert len(qkv.out_slices) == (1 if fused else 3)
    assert qkv.lora_a.shape[1] == len(qkv.out_slices)
    if model.startswith("gpt_oss"):
        assert not hasattr(layer.mlp, "gate_up_proj")
        return
    ungated = ("arcee", "phi_", "gpt_bigcode", "gpt2", "apertus", "opt_")
    if falcon or model.startswith(ungated):
        assert not hasattr(layer.mlp, "gate_up_proj")
        assert len(layer.mlp.up_proj.lora.out_slices) == 1
        return
    if model.startswith("granite4"):  # the Mamba in_proj's rows: one module, one term
        assert len(layers[0].self_attn.in_proj.lora.out_slices) == 1
        fused = True  # the shared MLP's input_linear holds gate and up
    assert len(layer.mlp.gate_up_proj.lora.out_slices) == (1 if fused else 2)


def test_llama_names_on_a_fused_checkpoint_are_refused_naming_them(tiny_model, tmp_path):
    """An adapter with separate q_proj ... up_proj weights cannot be for Phi-3's checkpoint
    (PEFT finds no such module in it), nor one with qkv_proj for Llama's: refused at load,
    naming the modules, never skipped."""
    llama = tiny_model("llama_gqa_llama3")  # the Phi-3s' hidden and intermediate sizes
    path = make_adapter(llama, tmp_path / "llama", seed=0, r=4, target_modules=ALL)
    model = load_model(tiny_model("phi3_gqa"), dtype=torch.float32, device=CPU, dist=Distributed())
    settings = LoraSettings(adapters={"llama": path}, max_loras=1)
    with pytest.raises(AdapterError, match=r"adapter 'llama': target_modules .*'q_proj'.*fuses"):
        LoraManager(model, settings)
    # target_modules as a regex (no list to check against): the first such module is named.
    config_file = path / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "target_modules": ".*_proj"}))
    with pytest.raises(AdapterError, match=r"module 'model\.layers\.0\.mlp\.gate_proj'.*fuses"):
        LoraManager(model, settings)
    # and the other way round: a Phi-3 adapter on a checkpoint with separate projections
    phi3 = make_adapter(
        tiny_model("phi3_gqa"), tmp_path / "phi3", seed=0, r=4, target_modules=PHI3_ALL
    )
    llama_model = load_model(llama, dtype=torch.float32, device=CPU, dist=Distributed())
    with pytest.raises(
        AdapterError, match=r"'qkv_proj'.*has separate q_proj/k_proj/v_proj; .* gate_proj/up_proj"
    ):
        LoraManager(llama_model, LoraSettings(adapters={"phi3": phi3}, max_loras=1))


def test_a_term_on_deepseeks_absorbed_kv_b_proj_is_refused_naming_it(tiny_model, tmp_path):
    """kv_b_proj is multiplied into each query and each output at load (latent attention's
    absorbed form): a term on it cannot be added per request, so such an adapter is refused."""
    base = tiny_model("deepseek_v3_mla")
    path = make_adapter(base, tmp_path / "kv_b", seed=0, r=4, target_modules=["kv_b_proj"])
    model = load_model(base, dtype=torch.float32, device=CPU, dist=Distributed())
    with pytest.raises(AdapterError, match=r"adapter 'kv_b': target_modules \['kv_b_proj'\]"):
        LoraManager(model, LoraSettings(adapters={"kv_b": path}, max_loras=1))
