"""Two gloo ranks on CPU must compute what one process computes: collectives, the partitioned
layers, and whole tiny models (prefill + decode through a paged cache)."""

from __future__ import annotations

import os
import socket
from collections import Counter

import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp
import torch.nn.functional as F
from paged_helpers import NATIVE_REASON, run_paged
from quant_fixtures import fixture
from safetensors.torch import save_file

from shard.distributed import Distributed, init_distributed
from shard.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from shard.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from shard.models import load_model
from shard.platforms.cpu.decode_loop import CpuDecodePath
from shard.sampling.params import SamplingParams
from shard.sampling.sampler import SamplingTensors, sample
from shard.weights import Weights

WORLD = 2
# Checkpoints made by a quantization tool (tests/shard/quant_fixtures.py), not built here
# (GPTQ packs the experts' codes along their inputs, AWQ along their outputs: each cut its way)
# Mixtral's experts as gptqmodel saves them, under `mlp` (shard/models/names.py)
QUANT_MOE = ["gptq_g32_sym_qwen3_moe", "awq_gemm_g32_qwen3_moe", "gptq_g32_sym_mixtral"]
# Mixture-of-Experts models, run both tensor parallel (the default) and expert parallel.
# gpt-oss: biased experts (the down bias added by one rank), its release's MXFP4 experts read in
# slices that split a 32-wide block, its sinks split with the query heads.
MOE_TP = [
    "mixtral_top2",
    "lfm2_moe_stacked",  # beside LFM2's short convolutions, split by channels
    "kolibri_stacked",  # the logit-bias router replicated, a shared expert split beside
    "cohere2_moe_shared_average",  # each rank's partial sum of routed and shared halved
    "flint_sinks_sigmoid",  # each rank its heads' sinks; the float32 sigmoid router replicated
    "qwen2_moe_shared_dense",
    "qwen3_moe_stacked",
    "gpt_oss_sinks_clamped",
    "gpt_oss_mxfp4",
    # GLM-4.5: the grouped sigmoid router, replicated; the ungated shared experts split
    "glm4_moe_grouped",
    # Nemotron 3: ungated experts' up rows split (or whole experts per rank), the ungated
    # shared expert's too, the latent projections replicated around the experts' partial sums
    "nemotron3_ungated_experts",
    "nemotron3_latent_stacked",
    # Phi-3.5-MoE: the sparsemixer router replicated, Mixtral's experts split
    "phimoe_sparsemixer_longrope",
    # DeepSeek: query heads and kv_b_proj's up-projections split, the latent projections
    # (with biases in V2's case) computed whole on both ranks, each caching the same latent
    "deepseek_v3_mla",
    "deepseek_v2_grouped",
    # DeepSeek Sparse Attention: the indexer computed whole on both ranks, which choose alike
    "deepseek_v32_sparse_attention",
    # Mistral Large 4: its indexer's input norm and position scales whole on both ranks, the
    # attention's position scales each rank's heads'
    "mistral_large4_sparse_nope",
    # ERNIE 4.5: the softmax choice with a correction bias, the dense layers' biases
    "ernie4_5_moe_biased_choice",
    # MiniMax-M2: whole-projection q/k norms (their all-reduce) with partial rotary, the
    # sigmoid router's logits in the model's dtype
    "minimax_m2_projection_norms",
    "olmoe_projection_norms",  # the same norms with Llama's rounding; every layer sparse
    "granite_moe_multipliers",  # stacked experts split per rank under Granite's multipliers
    # sink logits read per rank's heads, a fused shared expert split by columns and rows
    "granite_moe_swa_shared",
    # attention's output gate read per rank's heads; sigmoid scores with an expert bias
    "afmoe_gated_nope",
    # Laguna: each layer's own query heads split (4, 8, 2, 6: 2, 4, 1, 3 a rank) with their
    # softplus gates' rows (a head's, or a head dim's in transformers' own names); the
    # soft-capped router replicated
    "laguna_head_counts_softcapped",
    "laguna_per_element_stacked",
    "mellum_sliding_dense_first",  # Qwen3-MoE's experts after a dense layer, windows of 7
    # q/k norms after the rotary on each rank's heads; a float32 router and a shared MLP
    "hunyuan_moe_shared",
    # Mistral 4: latent attention's heads split, each rank's queries scaled by position
    "mistral4_grouped_position_scaled",
    # Qwen3.5-MoE: linear attention's key heads (and their value heads) split with their
    # conv channels and state pools; the stacked experts and the gated shared expert
    "qwen3_5_moe_linear_attention",
    # Qwen3-Next: the fused projections' rows taken per key head group; dense layers between
    "qwen3_next_fused_projections",
    # Kimi Linear and Ling: KDA's heads split (q, k, v, the gates' and b's rows, the three
    # convs, dt_bias, A_log and the pools), the low-rank gates' first halves whole on each
    # rank; latent attention's heads (Ling's gate a head with them), DeepSeek-V3's experts
    "kimi_linear_kda_nope_mla",
    "bailing_hybrid_kda_gated_mla",
    # Granite 4.0-H: the Mamba heads split, both ranks reading the one group's B and C, whose
    # gated norm spans the ranks; the experts beside the shared MLP
    "granite4_hybrid_moe",
    # Gemma 4's experts beside the dense MLP, reduced apart (each half is normed after its
    # sum); the global layers' one KV head, its values its keys' rows, replicated on both
    "gemma4_experts_beside_dense",
    # Llama 4: experts read transposed, split by columns; their weights on the inputs; the
    # ungated shared expert split; chunked and position-scaled layers on each rank's heads
    "llama4_chunked_nope_top1",
    # Jamba: Mamba 1 mixers split by channels beside attention heads without rotary, experts
    # split (or whole per rank) under the unrenormalised softmax router, replicated
    "jamba_mamba1_attention_experts",
    # int4 experts as gptqmodel saved them (tests/quant_fixtures/): each expert's GPTQ gate/up
    # columns and down rows cut on group boundaries, int4 attention split likewise
    *QUANT_MOE,
]

# Their q/k norms add one all_reduce a layer (both norms' sums of squares in one).
PROJECTION_QK_NORM = ["olmo2_projection_qk_norm", "olmo3_sliding_one_kv_head"]
PROJECTION_QK_NORM_MOE = ["minimax_m2_projection_norms", "olmoe_projection_norms"]

# (per layer, beyond the layers) all_reduces where they differ from one for o_proj and one for
# down_proj a layer, one for the embedding: Gemma 4's experts reduced apart from the dense MLP;
# its per-layer embeddings' table and each layer's projection of them
ALL_REDUCES = {
    "gemma4_experts_beside_dense": (3, 1),
    "gemma4_per_layer_inputs_kv_sharing": (3, 2),
    # Gemma 4's three a layer and two beyond, and the two sparse MLPs' row sums of their gates
    "gemma3n_altup_laurel_sparse": (3, 4),
    # the two Mamba layers' gated norms: their one group's sums of squares span the ranks
    "granite4_hybrid_moe": (2, 3),
    # one module a layer, so one row-parallel output
    "nemotron_h_one_module_layers": (1, 1),
    "nemotron3_ungated_experts": (1, 1),
    "nemotron3_latent_stacked": (1, 1),
    # attention's o_proj and the mixer's out_proj side by side, then the MLP's
    "falcon_h1_gate_before_norm": (3, 1),
    "mamba2_pure": (1, 1),  # the mixer's out_proj alone
    # and the one softmax layer's q/k norms, whose sums span the projection
    "olmo_hybrid_delta_post_norm": (2, 2),
    # Mamba 1's x_proj (row-parallel: dt, B and C summed over the channels) and out_proj
    "mamba1_biased": (2, 1),
    "falcon_mamba_bcdt_norms": (2, 1),
    # o_proj or out_proj and the MLP's a layer, and each of the three Mamba layers' x_proj
    "jamba_mamba1_attention_experts": (2, 4),
}
# Models whose layers the CPU decode loop does not restate (tests/shard/test_cpu_decode.py):
# Gemma 4's and NemotronH's own layers; Llama 4's chunked attention, which the native decode
# kernel lacks
OWN_LAYERS = [
    "gemma4_per_layer_inputs_kv_sharing", "gemma4_experts_beside_dense", "llama4_chunked_nope_top1",
    "nemotron_h_one_module_layers",  # one module a layer
    "nemotron3_ungated_experts", "nemotron3_latent_stacked",
    "gemma3n_altup_laurel_sparse",  # Gemma 3n's, over its streams
    "falcon_h1_gate_before_norm",  # Falcon-H1's, two mixers side by side
    "mamba2_pure",  # NemotronH's one-module blocks
    "mamba1_biased", "falcon_mamba_bcdt_norms",  # pure Mamba 2's blocks, Mamba 1's mixer
    # values narrower than keys, which the loop does not restate
    "mimo_v2_flash_narrow_values", "mimo_v2_flash_stacked_grouped",
]  # fmt: skip
# How far two ranks' float32 logits may be from one's: the sums' order differs. Gemma 4's
# per-layer input is an RMSNorm straight after a row-parallel sum over 8 inputs (4 a rank),
# which rescales that sum's rounding with it, in each of 6 layers: 1.6e-5 where the others
# stay under 2e-6.
TWO_RANKS_ATOL = {
    "gemma4_per_layer_inputs_kv_sharing": 5e-5,
    "gemma3n_altup_laurel_sparse": 5e-5,  # Gemma 4's per-layer inputs, into three streams
}

CPU = torch.device("cpu")
# GQA split across ranks, one KV head replicated on both, qkv bias, and a vocab of 509 (padded).
MODELS = [
    "llama_gqa_llama3",
    "mistral_mqa",
    "qwen2_bias",
    "llama_odd_vocab",
    "llama_tied_linear_bias",
    "qwen3_qk_norm_sliding",
    # GeGLU, sandwich norms, soft-capping, a replicated KV head; fused qkv / gate_up tensors
    # split per rank with partial longrope
    "gemma2_softcap_alternating",
    "gemma3_qk_norm_local_rope",
    "phi3_partial_longrope",
    # the first Gemma's one KV head replicated; Helium's float32-scaled norms, interleaved rotary
    "gemma_geglu_one_kv_head",
    "helium_fp32_norms_qkv_bias",
    "arcee_relu2_ungated_yarn",  # the ungated MLP's up_proj split by columns
    "apertus_xielu_qk_norm",  # ... through each layer's xIELU, its parameters on every rank
    # q/k normed over the whole projection, each rank holding part of it: KV heads split (OLMo
    # 2) and one replicated on both (OLMo 3); per-head q/k norms and a NoPE layer (EXAONE 4)
    *PROJECTION_QK_NORM,
    "exaone4_sliding_nope",
    "glm4_interleaved_partial",  # fused gate_up and interleaved partial rotary, heads split
    "ernie4_5_biased_interleaved",  # o_proj and down_proj biases added once, by rank 0
    "cohere2_sliding_nope",  # attention and MLP in parallel: both outputs reduced, then added
    # Phi's head bias split by vocabulary with its tied weight, its parallel outputs summed;
    # StarCoder2's biased ungated MLP (c_proj's bias added once); OLMo's q/k/v clamped per rank
    "phi_qk_layernorm_tied",
    "starcoder2_biased_sliding",
    "olmo_weightless_norms_clip",
    "gpt_neox_parallel_two_norms",  # q/k/v fused by head: each rank's heads' rows picked out
    # StarCoder's one KV head replicated on both ranks beside its split query heads, the learned
    # position table whole on each; without multi_query, fused by head as GPT-NeoX's
    "gpt_bigcode_multi_query",
    "gpt_bigcode_per_head_qkv",
    "opt_learned_positions",  # OPT's positions table whole on each rank, q/k/v biases split
    "gpt2_conv1d",  # GPT-2's Conv1D weights: each rank's rows read as columns, transposed
    # ALiBi: each rank its 3 heads' slopes (BLOOM's last two the odd in-between ones)
    "bloom_alibi_six_heads",
    "mpt_alibi_clip_scale",
    "nanochat_reverse_rope",  # weightless norms, the reversed rotary on each rank's heads
    # Falcon's q/k/v grouped by KV head: each rank its groups' query heads, keys and values
    "falcon_grouped_two_norms",
    "falcon_multi_query_one_norm",
    "stablelm2_parallel_qk_layernorm",  # each rank the q/k LayerNorms of its own heads
    # linear attention split by key heads (out_proj reduced as o_proj is); the query-computed
    # output gate read per rank's heads
    "qwen3_5_linear_attention",
    "olmo_hybrid_delta_post_norm",  # q, k, v and their three convs each cut to the rank's heads
    "lara_mini_single_in_proj",  # each rank its heads' q, k, v, z, b and a rows of one in_proj
    # narrow values split by head as q and k are (the sliding layers' doubled KV heads too),
    # each rank its heads' sinks
    "mimo_v2_flash_narrow_values",
    "mimo_v2_flash_stacked_grouped",
    # Mamba 2 heads split by groups, each rank its group's B and C, conv channels and states
    "granite4_hybrid_dense_nope",
    # LFM2's short convolutions split by channels: each rank its B, C and x, conv and states
    "lfm2_short_conv_hybrid",
    "lfm3_gated_sliding_sandwich",  # LFM3's gates a head: each rank its heads' rows
    "mamba2_pure",  # Mamba 2 alone: a group of heads a rank, no K/V anywhere
    # Mamba 1: the inner channels split (x and z, the conv, dt_proj's rows, A, D, its states),
    # x_proj row-parallel, the biases of in_proj split and out_proj's added once; FalconMamba's
    # norms of dt, B and C over the reduced whole
    "mamba1_biased",
    "falcon_mamba_bcdt_norms",
    # Falcon-H1: Mamba heads (a group a rank) and attention heads split side by side, the
    # in_proj's per-part scales cut with its rows
    "falcon_h1_gate_before_norm",
    # NemotronH's one-module layers: MLP blocks beside the mixers, each its own residual add
    "nemotron_h_one_module_layers",
    # Gemma 4's per-layer embeddings: the table split by vocabulary, each layer's gate by its
    # outputs (each rank gating its columns of the input) and projection by its inputs; the
    # KV-sharing layers' queries split, the caches they read their source's
    "gemma4_per_layer_inputs_kv_sharing",
    # Gemma 3n: AltUp, Laurel and the stream projections whole on each rank; the sparse MLPs'
    # cutoffs from their gates' row statistics summed over the ranks
    "gemma3n_altup_laurel_sparse",
    # Mixture-of-Experts: every expert's intermediate split per rank (the stacked layout too);
    # the shared expert and the routed ones reduced together
    *MOE_TP,
]
PROMPTS = [torch.arange(5, 26), torch.arange(40, 77) * 3 % 300]  # 21 and 37 tokens, ids < 320
STEPS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def layer_inputs() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "q.weight": torch.randn(4 * 4, 8, generator=gen),
        "q.bias": torch.randn(16, generator=gen),
        "k.weight": torch.randn(4, 8, generator=gen),  # one KV head: replicated on both ranks
        "k.bias": torch.randn(4, generator=gen),
        "v.weight": torch.randn(4, 8, generator=gen),
        "v.bias": torch.randn(4, generator=gen),
        "o.weight": torch.randn(8, 16, generator=gen),
        "o.bias": torch.randn(8, generator=gen),
        "embed.weight": torch.randn(13, 8, generator=gen),
        "head.weight": torch.randn(13, 8, generator=gen),  # untied; 13 rows pad to 2 x 7
        "gate.weight": torch.randn(12, 8, generator=gen),
        "up.weight": torch.randn(12, 8, generator=gen),
        "down.weight": torch.randn(8, 12, generator=gen),
        "down.bias": torch.randn(8, generator=gen),
        "x": torch.randn(5, 8, generator=gen),
        "ids": torch.tensor([0, 6, 7, 12, 3]),
    }


def worker(rank: int, port: int, layer_dir: str, model_dirs: dict[str, str], out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    dist = init_distributed(CPU)
    results: dict[str, object] = {}

    t = torch.full((3,), float(rank + 1), dtype=torch.bfloat16)
    results["all_reduce_bf16"] = dist.all_reduce(t).clone()
    results["all_reduce"] = dist.all_reduce(torch.tensor([rank, 10.0 * rank]))
    results["all_gather"] = dist.all_gather(torch.full((2, 1), float(rank)), dim=1)
    results["broadcast"] = dist.broadcast(torch.tensor([rank + 5.0]), src=1)

    w = Weights(layer_dir, dtype=torch.float32, device=CPU, dist=dist)
    inputs = layer_inputs()
    qkv = QKVParallelLinear.load_qkv(
        w, ["q", "k", "v"], num_heads=4, num_kv_heads=1, head_dim=4, bias=True
    )
    q, k, v = qkv.split(qkv(inputs["x"]))
    results["q"] = dist.all_gather(q, dim=1)
    results["k"], results["v"] = k, v
    o = RowParallelLinear.load(w, "o", bias=True)
    results["o"] = o(q.flatten(1))  # this rank's heads in, full (reduced) output out
    emb = VocabParallelEmbedding.load(w, "embed.weight", 13)
    results["embed"] = emb(inputs["ids"])
    results["lm_head"] = ParallelLMHead.tied(emb)(inputs["x"])
    results["lm_head_untied"] = ParallelLMHead.load(w, "head.weight", 13)(inputs["x"])
    gate_up = MergedColumnParallelLinear.load_merged(w, ["gate", "up"], bias=False, num_blocks=2)
    down = RowParallelLinear.load(w, "down", bias=True)
    gate, up = gate_up.split(gate_up(inputs["x"]))
    results["mlp"] = down(F.silu(gate) * up)
    results["row_bias_here"] = (o.bias is not None, down.bias is not None)

    for name, path in model_dirs.items():
        model = load_model(path, dtype=torch.float32, device=CPU, dist=dist)
        with count_collectives() as counts:
            run_paged(model, PROMPTS[:1], 0)  # one prefill: forward + logits
        results[f"{name}/collectives"] = (dict(counts), model.num_layers)
        logits, tokens = run_paged(model, PROMPTS, STEPS, seed=3)
        results[name] = (logits, tokens)
        decode_path = CpuDecodePath.build(model, None)
        results[f"{name}/decode_path"] = decode_path and run_paged(
            model, PROMPTS, STEPS, seed=3, decode_forward=decode_path
        )
        results[f"{name}/sampled"] = sample_without_broadcast(logits[-1])
        results[f"{name}/expert_elements"] = _expert_elements(model)
    for name in MOE_TP:
        model = load_model(
            model_dirs[name], dtype=torch.float32, device=CPU, dist=dist, expert_parallel=True
        )
        with count_collectives() as counts:
            run_paged(model, PROMPTS[:1], 0)
        results[f"{name}/ep/collectives"] = (dict(counts), model.num_layers)
        results[f"{name}/ep"] = run_paged(model, PROMPTS, STEPS, seed=3)
        results[f"{name}/ep/expert_elements"] = _expert_elements(model)
    # bf16, where the flat loop calls the AMX tile kernel itself and then the all_reduce
    model = load_model(model_dirs[MODELS[0]], dtype=torch.bfloat16, device=CPU, dist=dist)
    decode_path = CpuDecodePath.build(model, None)
    results["bf16/decode_path"] = decode_path and run_paged(
        model, PROMPTS, STEPS, decode_forward=decode_path
    )
    results["bf16"] = run_paged(model, PROMPTS, STEPS)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    tdist.barrier()
    tdist.destroy_process_group()


def _expert_elements(model: torch.nn.Module) -> int:
    """The elements of the model's routed experts' weights this rank holds (int4 experts'
    packed tensors are their modules' buffers; not the biases, which only rank 0 may hold)."""
    weights = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    int4 = (".experts.w13.", ".experts.w2.")
    return weights + sum(b.numel() for n, b in model.named_buffers() if any(k in n for k in int4))


def model_dir(tiny_model, name: str):
    return fixture(name) if name in QUANT_MOE else tiny_model(name)


class count_collectives:
    """Counts the torch.distributed calls made inside the block (the layers call them by name)."""

    def __enter__(self) -> Counter:
        self.counts: Counter = Counter()
        self.saved = {n: getattr(tdist, n) for n in ("all_reduce", "all_gather", "broadcast")}
        for name, real in self.saved.items():
            setattr(tdist, name, self._counting(name, real))
        return self.counts

    def _counting(self, name, real):
        def call(*args, **kwargs):
            self.counts[name] += 1
            return real(*args, **kwargs)

        return call

    def __exit__(self, *exc) -> None:
        for name, real in self.saved.items():
            setattr(tdist, name, real)


# Greedy, sampled without a seed (0), seeded, and seeded with every warper and a penalty.
SAMPLING = [
    SamplingParams(),
    SamplingParams(do_sample=True),
    SamplingParams(do_sample=True, seed=1234),
    SamplingParams(do_sample=True, seed=99, temperature=0.7, top_k=20, top_p=0.9),
    SamplingParams(do_sample=True, seed=5, typical_p=0.8, repetition_penalty=1.3),
]


def sample_without_broadcast(logits: torch.Tensor) -> list[list[int]]:
    """Each rank samples on its own (the runner's broadcast is left out): 16 steps of draws
    for every parameter set over the same logits; only the step counter changes."""
    rows = logits[:1].expand(len(SAMPLING), -1)
    history = torch.arange(6).repeat(len(SAMPLING), 1)
    tensors = SamplingTensors.from_params(SAMPLING, [3] * len(SAMPLING), CPU)
    steps = []
    for step in range(16):
        lens = torch.full((len(SAMPLING),), 6 + step)
        steps.append(sample(rows, tensors, history, lens).next_ids.tolist())
    return steps


@pytest.fixture(scope="module")
def ranks(tiny_model, tmp_path_factory):
    layer_dir = tmp_path_factory.mktemp("tp_layers")
    save_file(
        {k: v for k, v in layer_inputs().items() if k not in ("x", "ids")},
        layer_dir / "model.safetensors",
    )
    model_dirs = {name: str(model_dir(tiny_model, name)) for name in MODELS}
    out_dir = tmp_path_factory.mktemp("tp_out")
    mp.spawn(
        worker,
        args=(free_port(), str(layer_dir), model_dirs, str(out_dir)),
        nprocs=WORLD,
        join=True,
    )
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def test_collectives(ranks):
    for r, res in enumerate(ranks):
        assert torch.equal(res["all_reduce_bf16"], torch.full((3,), 3.0, dtype=torch.bfloat16))
        assert torch.equal(res["all_reduce"], torch.tensor([1.0, 10.0]))
        assert torch.equal(res["all_gather"], torch.tensor([[0.0, 1.0], [0.0, 1.0]]))
        assert torch.equal(res["broadcast"], torch.tensor([6.0])), f"rank {r}"


def test_partitioned_layers_match_unpartitioned(ranks):
    t = layer_inputs()
    x = t["x"]
    q = (x @ t["q.weight"].T + t["q.bias"]).view(5, 4, 4)
    k = (x @ t["k.weight"].T + t["k.bias"]).view(5, 1, 4)
    v = (x @ t["v.weight"].T + t["v.bias"]).view(5, 1, 4)
    o = q.flatten(1) @ t["o.weight"].T + t["o.bias"]
    for res in ranks:
        torch.testing.assert_close(res["q"], q)
        torch.testing.assert_close(res["k"], k)
        torch.testing.assert_close(res["v"], v)
        torch.testing.assert_close(res["o"], o)
        torch.testing.assert_close(res["embed"], t["embed.weight"][t["ids"]])
        torch.testing.assert_close(res["lm_head"], x @ t["embed.weight"].T)
        torch.testing.assert_close(res["lm_head_untied"], x @ t["head.weight"].T)
        gate, up = x @ t["gate.weight"].T, x @ t["up.weight"].T
        mlp = (F.silu(gate) * up) @ t["down.weight"].T + t["down.bias"]
        torch.testing.assert_close(res["mlp"], mlp)
    # Row-parallel biases live on rank 0 only, so the all_reduce adds them exactly once.
    assert [res["row_bias_here"] for res in ranks] == [(True, True), (False, False)]


@pytest.mark.parametrize("name", MODELS)
def test_one_all_reduce_per_row_layer_and_one_gather_for_logits(ranks, name):
    for res in ranks:
        counts, layers = res[f"{name}/collectives"]
        # o_proj and down_proj in every layer (and the q/k norms' sums where they span the
        # projection), plus the embedding's masked-lookup sum.
        per_layer = 3 if name in PROJECTION_QK_NORM + PROJECTION_QK_NORM_MOE else 2
        per_layer, extra = ALL_REDUCES.get(name, (per_layer, 1))
        assert counts == {"all_reduce": per_layer * layers + extra, "all_gather": 1}


@pytest.mark.parametrize("name", MODELS)
def test_ranks_sample_the_same_tokens_on_their_own(ranks, name):
    first, second = (res[f"{name}/sampled"] for res in ranks)
    assert first == second  # every step, greedy and sampled, with and without a seed
    for res in ranks:  # and the logits they sample from are bit-identical
        for got, want in zip(res[name][0], ranks[0][name][0], strict=True):
            assert torch.equal(got, want)
    per_row = list(zip(*first, strict=True))
    assert len(set(per_row[0])) == 1  # greedy: the same argmax at every step
    assert len(set(per_row[2])) > 1  # sampled: the draws change with the step
    assert per_row[1] != per_row[2]  # the seed matters


@pytest.mark.skipif(NATIVE_REASON is not None, reason=f"no native kernels: {NATIVE_REASON}")
@pytest.mark.parametrize("name", [*(n for n in MODELS if n not in OWN_LAYERS), "bf16"])
def test_decode_path_equals_module_forward_on_each_rank(ranks, name):
    """Each rank's flat decode loop (its row layers' all_reduce included) gives the module
    forward's logits bit for bit."""
    for rank, res in enumerate(ranks):
        assert res[f"{name}/decode_path"] is not None, f"rank {rank} built no decode path"
        logits, tokens = res[f"{name}/decode_path"]
        want_logits, want_tokens = res[name]
        assert tokens == want_tokens
        for got, want in zip(logits, want_logits, strict=True):
            assert torch.equal(got, want), f"rank {rank}"


@pytest.mark.parametrize("name", MODELS)
def test_two_ranks_match_one(ranks, tiny_model, name):
    single = load_model(
        model_dir(tiny_model, name), dtype=torch.float32, device=CPU, dist=Distributed()
    )
    want_logits, want_tokens = run_paged(single, PROMPTS, STEPS, seed=3)
    atol = TWO_RANKS_ATOL.get(name, 1e-5)
    for rank, res in enumerate(ranks):
        logits, tokens = res[name]
        assert tokens == want_tokens, f"rank {rank} diverged"
        for step, (got, want) in enumerate(zip(logits, want_logits, strict=True)):
            torch.testing.assert_close(got, want, atol=atol, rtol=0, msg=f"rank {rank} step {step}")


@pytest.mark.parametrize("name", MOE_TP)
def test_expert_parallel_ranks_match_one(ranks, tiny_model, name):
    """Each rank holds half the experts whole, skips the other half's choices, and the one
    all_reduce per layer sums the halves."""
    single = load_model(
        model_dir(tiny_model, name), dtype=torch.float32, device=CPU, dist=Distributed()
    )
    want_logits, want_tokens = run_paged(single, PROMPTS, STEPS, seed=3)
    for rank, res in enumerate(ranks):
        logits, tokens = res[f"{name}/ep"]
        assert tokens == want_tokens, f"rank {rank} diverged"
        for step, (got, want) in enumerate(zip(logits, want_logits, strict=True)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0, msg=f"rank {rank} step {step}")
        counts, layers = res[f"{name}/ep/collectives"]
        per_layer = 3 if name in PROJECTION_QK_NORM_MOE else 2
        per_layer, extra = ALL_REDUCES.get(name, (per_layer, 1))
        assert counts == {"all_reduce": per_layer * layers + extra, "all_gather": 1}


@pytest.mark.parametrize("mode", ["", "/ep"])
@pytest.mark.parametrize("name", MOE_TP)
def test_each_rank_holds_half_the_expert_weights(ranks, tiny_model, name, mode):
    single = load_model(
        model_dir(tiny_model, name), dtype=torch.float32, device=CPU, dist=Distributed()
    )
    whole = _expert_elements(single)
    assert whole > 0
    assert [res[f"{name}{mode}/expert_elements"] for res in ranks] == [whole // WORLD] * WORLD


def test_world_size_one_needs_no_process_group(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    dist = init_distributed(CPU)
    assert (dist.rank, dist.world_size, dist.local_rank, dist.device) == (0, 1, 0, CPU)
    assert not tdist.is_initialized()
    t = torch.ones(3)
    assert dist.all_reduce(t) is t and dist.broadcast(t) is t and dist.all_gather(t, 0) is t


def test_rank_outside_world_is_refused(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="RANK=2.*WORLD_SIZE=2"):
        init_distributed(CPU)
