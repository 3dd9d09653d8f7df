"""The model configuration a shard needs, read once from the checkpoint directory."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shard.layers.activation import gated_activation, mlp_activation
from shard.layers.quant.config import QuantizationConfig, parse_quantization_config
from shard.layers.rotary import QueryPositionScale, RopeConfig


class UnsupportedArchitectureError(ValueError):
    pass


def read_architecture(model_dir: Path) -> str:
    """architectures[0] of config.json, read raw so that unknown model types get a clear error."""
    config = json.loads((model_dir / "config.json").read_text())
    architectures = config.get("architectures") or []
    if not architectures:
        raise UnsupportedArchitectureError(f"{model_dir}/config.json names no architectures")
    return architectures[0]


def read_quantization(model_dir: Path) -> QuantizationConfig | None:
    """config.json's quantization_config (compression_config in older compressed-tensors
    exports), parsed; None for a floating-point checkpoint."""
    config = json.loads((model_dir / "config.json").read_text())
    raw = config.get("quantization_config") or config.get("compression_config")
    return parse_quantization_config(raw)


def read_config_dict(model_dir: Path) -> dict[str, Any]:
    """config.json with the model type's defaults filled in (save_pretrained omits fields that
    equal them) and old-style rope fields standardized, as transformers itself reads it."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_dir).to_dict()


def read_eos_token_ids(model_dir: Path, config: dict[str, Any]) -> list[int]:
    found: list[int] = []
    text_config = config.get("text_config")  # a vision-language wrapper's LM says it there
    sources = [config.get("eos_token_id")]
    if isinstance(text_config, dict):
        sources.append(text_config.get("eos_token_id"))
    generation_config = model_dir / "generation_config.json"
    if generation_config.exists():
        sources.append(json.loads(generation_config.read_text()).get("eos_token_id"))
    for value in sources:
        for token in value if isinstance(value, list) else [value]:
            if token is not None and token not in found:
                found.append(int(token))
    return found


@dataclass(frozen=True)
class MoeConfig:
    """A Mixture-of-Experts MLP's options (shard/models/moe_block.py)."""

    num_experts: int
    top_k: int
    intermediate_size: int  # each expert's
    # the top-k probabilities divided by their sum (Mixtral; Qwen's norm_topk_prob)
    renormalize: bool
    # the top-k probabilities rounded to the model's dtype before they weight the experts'
    # outputs (transformers' Qwen MoE blocks do; Mixtral's weights in float32)
    round_weights: bool
    # per layer: whether its MLP is the sparse block (Qwen's mlp_only_layers and
    # decoder_sparse_step leave some dense, with ModelConfig.intermediate_size)
    sparse_layers: tuple[bool, ...]
    # Qwen2-MoE's shared expert, a gated MLP every token takes, scaled by sigmoid(gate(x)); 0: none
    shared_expert_intermediate_size: int = 0
    # gpt-oss: a router with a bias; experts stored transposed with gate/up interleaved, with
    # biases (shard/layers/moe_interleaved.py); their activation, when it is not the model's
    # hidden_act, and the clamped SwiGLU's (alpha, limit)
    router_bias: bool = False
    interleaved_experts: bool = False
    expert_act: str | None = None
    swiglu: tuple[float, float] | None = None
    # Llama 4: "top_sigmoid", the top-k logits each weighted by its sigmoid (route_top_sigmoid).
    # GLM-4.5 (DeepSeek-V3's router): "sigmoid" scores chosen with a per-expert correction bias
    # within the best `top_groups` of `num_groups` expert groups, the weights times
    # `routed_scaling` (shard/layers/moe.py route_grouped_sigmoid); the router in float32. Its
    # shared experts are added ungated (`shared_expert_gated` False).
    scoring: str = "softmax"
    num_groups: int = 1
    top_groups: int = 1
    routed_scaling: float = 1.0
    shared_expert_gated: bool = True
    # the router's weight and logits in float32, read from the stored values (GLM-4.5's and
    # DeepSeek's, which transformers keeps in float32)
    float32_router: bool = False
    # a per-expert bias added to the scores for the choice only (`router_correction_bias`:
    # GLM-4.5's and DeepSeek-V3's sigmoid scores, ERNIE 4.5's softmax probabilities)
    correction_bias: bool = False
    # renormalised weights are divided by max(their sum, this) (ERNIE 4.5's moe_norm_min)
    renormalize_min: float = 0.0
    # added to the sum the "sigmoid" scoring renormalises by (DeepSeek-V3's 1e-20, LFM2-MoE's 1e-6)
    renormalize_eps: float = 1e-20
    # the shared expert's output and the routed experts' averaged, not summed (Command A+'s)
    shared_expert_averaged: bool = False
    # the "sigmoid" scoring's correction bias added to the logits for the choice, not to their
    # sigmoids (Kolibri's)
    correction_on_logits: bool = False
    # with softmax scoring and groups, what ranks a group: "max", its best probability
    # (DeepSeek-V2's group_limited_greedy), or "top2", its two best summed (Mistral 4)
    group_score: str = "max"
    # Llama 4: each chosen expert reads the token times its weight and its output is added as
    # it is (the weight inside the expert's nonlinearity), where the others weight the outputs
    weights_on_input: bool = False
    # transformers' stacked expert parameters input dimension first (Llama 4's gate_up
    # [E, H, 2I] and down [E, I, H]); None: as the stored shapes say (Qwen3-VL-MoE's Hub files
    # are, transformers 5's module layout is not); per-expert checkpoints are read as every
    # model's
    transposed_experts: bool | None = False
    # Phi-3.5-MoE: "sparsemixer" scoring (route_sparsemixer) with its router_jitter_noise
    jitter_eps: float = 0.0
    # Nemotron 3: experts of an up and a down projection, act(up) without a gate (the model's
    # hidden_act, relu^2), and a shared expert of the same kind (ModelConfig.gated_mlp False)
    gated_experts: bool = True
    # Nemotron 3 Super: the experts run in a latent space of this width, the token projected
    # into it (fc1_latent_proj) and their weighted sum back out (fc2_latent_proj); 0: none
    latent_size: int = 0
    # the router's logits capped, cap * tanh(logit / cap), in float32 before they are scored
    # (Laguna's moe_router_logit_softcapping); 0: not capped
    router_softcap: float = 0.0


@dataclass(frozen=True)
class MlaConfig:
    """Multi-head latent attention's shapes (DeepSeek-V2/V3; shard/models/latent_attention.py):
    queries through a low-rank bottleneck (`q_lora_rank`, None: one q_proj), keys and values
    from one latent of `kv_lora_rank` per token plus a rotary key part shared by every head."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int  # each head's query/key dims without position encoding
    qk_rope_head_dim: int  # ... and with it (rotary)
    v_head_dim: int
    # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): each token attends over the tokens its
    # layer's indexer picks, not its whole context; None: dense MLA
    indexer: IndexerConfig | None = None
    # Mistral Large 4's layers without position encoding: their whole query head is "nope"
    # (qk_nope + qk_rope dims) and their latent has no rotary key part; empty: none
    nope_layers: tuple[bool, ...] = ()
    # Mistral Large 4's learned query scale per head and position (shard/layers/
    # head_position_scale.py), on the attention's queries and the indexer's
    head_position_scale: bool = False
    # the latent norms' epsilon: transformers builds DeepSeek's with RMSNorm's default, whatever
    # the config's rms_norm_eps; Mistral Large 4's kv_a norm with rms_norm_eps (None: that)
    latent_norm_eps: float | None = 1e-6

    def of_layer(self, layer: int) -> MlaConfig:
        """The shapes of `layer`'s latent attention (a NoPE layer's differ)."""
        if not (self.nope_layers and self.nope_layers[layer]):
            return self
        return replace(
            self,
            qk_nope_head_dim=self.qk_nope_head_dim + self.qk_rope_head_dim,
            qk_rope_head_dim=0,
        )


@dataclass(frozen=True)
class IndexerConfig:
    """DeepSeek Sparse Attention's lightning indexer (shard/models/sparse_attention.py): per
    token, `num_heads` small queries of `head_dim` (from the query's low-rank latent) score every
    earlier token's one indexer key, and the token attends over the `top_k` best-scored only.
    The first `rope_dims` dims of each are rotated, in halves (DeepSeek-V3.2) or in interleaved
    pairs (`rope_interleaved`, GLM-5). GLM-5's `shared_layers` reuse the choice of the layer
    before them instead of running an indexer of their own."""

    num_heads: int
    head_dim: int
    top_k: int
    rope_interleaved: bool = False
    shared_layers: tuple[bool, ...] = ()
    # Mistral Large 4's: the queries from the layer's input through a LayerNorm of their own
    # (its attention has no query latent), and scaled per head by position
    query_norm: bool = False

    def shared(self, layer: int) -> bool:
        return bool(self.shared_layers) and self.shared_layers[layer]


@dataclass(frozen=True)
class LinearAttentionConfig:
    """Gated DeltaNet linear attention (Qwen3.5, Qwen3-Next; shard/models/linear_attention.py):
    the layers it replaces softmax attention in, and its shapes. Each such layer keeps a fixed
    state per sequence (a recurrent matrix per value head and the last conv inputs) instead of
    K/V per token."""

    layers: tuple[bool, ...]  # per layer: linear attention (True) or softmax attention
    num_key_heads: int
    num_value_heads: int  # a multiple of num_key_heads: each key head serves that many
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int  # the causal depthwise convolution over q, k and v
    # How the checkpoint stores the input projections: "split", Qwen3.5's in_proj_qkv,
    # in_proj_z, in_proj_b, in_proj_a; "grouped", Qwen3-Next's in_proj_qkvz and in_proj_ba, rows
    # grouped by key head; "separate", OLMo-Hybrid's q_proj, k_proj, v_proj, g_proj, b_proj,
    # a_proj; "single", Lara's one in_proj, rows [q | k | v | z | b | a]
    projections: str = "split"
    # the write strength's range: sigmoid * 2 lets the delta rule's eigenvalues go negative
    # (OLMo-Hybrid's linear_allow_neg_eigval)
    beta_scale: float = 1.0
    # the gated output norm's epsilon where it is not the model's rms_norm_eps (OLMo-Hybrid's
    # is FLA's fixed 1e-5)
    norm_eps: float | None = None
    # the gated output norm scales in float32 before rounding (Lara's), where Qwen's rounds the
    # normed values to the model's dtype first
    norm_in_float32: bool = False

    @property
    def conv_channels(self) -> int:
        return (
            2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim
        )


@dataclass(frozen=True)
class KdaConfig:
    """Kimi Delta Attention (Kimi Linear's and Ling's linear layers; shard/models/kda_mixer.py):
    Gated DeltaNet with a decay per key channel, `num_heads` heads of `head_dim` for q, k and v
    alike, in the layers it names."""

    layers: tuple[bool, ...]  # per layer: KDA (True) or softmax attention
    num_heads: int
    head_dim: int
    conv_kernel: int  # the causal depthwise convolution over q, k and v
    # the forget gate's log decay from f = f_proj(x) + dt_bias: "softplus", Kimi Linear's
    # -exp(A_log) softplus(f); "bounded", Ling's gate_lower_bound sigmoid(exp(A_log) f)
    gate: str = "softplus"
    gate_lower_bound: float = -5.0
    # Ling's: the gate's g rounded to the model's dtype (transformers' BailingHybridForgetGate
    # returns it so), and the convs kept in float32 (its _keep_in_fp32_modules)
    decay_in_model_dtype: bool = False
    float32_conv: bool = False


@dataclass(frozen=True)
class MambaConfig:
    """Mamba 2 mixers (Granite 4.0-H's; shard/models/mamba_mixer.py) in the layers they name:
    each keeps per sequence the last conv inputs and a [state_size, head_dim] state per head
    instead of K/V per token. `num_groups` groups of heads share their B and C projections."""

    layers: tuple[bool, ...]  # per layer: a Mamba 2 mixer (True) or softmax attention
    num_heads: int
    head_dim: int
    num_groups: int
    state_size: int
    conv_kernel: int
    conv_bias: bool
    proj_bias: bool  # in_proj and out_proj biases
    # the per-token step clamped to (low, high) after its softplus (time_step_limit)
    time_step_limit: tuple[float, float] = (0.0, float("inf"))
    # Falcon-H1: in_proj's outputs scaled per part, (z, x, B, C, dt) (its ssm_multipliers)
    projection_scales: tuple[float, ...] = ()
    # How the output meets the gate z: "gate_then_norm" (RMS-normed per group after the gate,
    # transformers' norm_before_gate False), "norm_then_gate", or "gate" alone (no norm)
    gate_norm: str = "gate_then_norm"
    out_bias: bool | None = None  # out_proj's bias (None: proj_bias)

    @property
    def intermediate_size(self) -> int:
        return self.num_heads * self.head_dim


@dataclass(frozen=True)
class Mamba1Config:
    """Mamba 1 mixers (Mamba, FalconMamba, Jamba; shard/models/mamba1_mixer.py) in the layers
    they name: each keeps per sequence the last conv inputs and a [state_size] state per inner
    channel instead of K/V per token."""

    layers: tuple[bool, ...]  # per layer: a Mamba 1 mixer (True) or softmax attention
    intermediate_size: int  # the inner channels (expand x hidden_size)
    state_size: int
    dt_rank: int  # the time step's low-rank width between x_proj and dt_proj
    conv_kernel: int
    conv_bias: bool
    proj_bias: bool  # in_proj and out_proj biases
    # RMS norms on x_proj's dt, B and C: "" none (Mamba), "weightless" (FalconMamba), "weighted"
    # (Jamba's dt_layernorm, b_layernorm, c_layernorm)
    bcdt_norm: str = ""
    norm_eps: float = 1e-6


@dataclass(frozen=True)
class FalconH1Scales:
    """Falcon-H1's multipliers of its layers' inputs and outputs (shard/models/falcon_h1.py)."""

    ssm_in: float = 1.0
    ssm_out: float = 1.0
    attention_in: float = 1.0
    attention_out: float = 1.0
    mlp_gate: float = 1.0
    mlp_down: float = 1.0


@dataclass(frozen=True)
class AltUpConfig:
    """Gemma 3n's AltUp (shard/models/gemma3n.py): the model carries `num_inputs` streams, the
    layers compute on the `active` one and correct the others from it; `correct_scale`: the
    corrected active stream is scaled before it gates the per-layer input. Each layer's MLP
    keeps only its gate's values above a Gaussian quantile (`sparsity`, 0: all)."""

    num_inputs: int
    active: int
    correct_scale: bool
    sparsity: tuple[float, ...]


@dataclass(frozen=True)
class ShortConvConfig:
    """LFM2's gated short convolutions (shard/models/short_conv.py) in the layers they name: each
    keeps per sequence its last `kernel` - 1 conv inputs instead of K/V per token."""

    layers: tuple[bool, ...]  # per layer: a short convolution (True) or softmax attention
    kernel: int  # conv_L_cache
    bias: bool  # in_proj's, the conv's and out_proj's


@dataclass(frozen=True)
class PerLayerInputConfig:
    """Gemma 4's per-layer embeddings (PLE; shard/models/gemma4.py): a second embedding table
    gives each token a `size`-wide input per layer, joined with a projection of its main
    embedding, which each layer gates into its residual stream."""

    vocab_size: int
    size: int


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    mlp_bias: bool
    hidden_act: str
    rope: RopeConfig
    sliding_window: int | None
    # Per layer: the sliding window it attends with, or None for full attention. Mistral slides
    # in every layer; Qwen2 (use_sliding_window) only in the layers its layer_types name.
    layer_windows: tuple[int | None, ...]
    eos_token_ids: tuple[int, ...]
    # How the checkpoint stores its linears (AWQ, GPTQ, compressed-tensors); None: floats.
    quantization: QuantizationConfig | None = None
    # The options the shared blocks take (shard/models/blocks.py); an architecture's own file
    # sets those its config states differently from Llama's defaults.
    # a kind of shard/layers/norm.py's NORMS: "rms", "gemma_rms", "fp32_rms", "layer",
    # "layer_bias", "layer_1p", "layer_weightless"; or "rms_weightless" (blocks.load_norm:
    # nanochat's RMSNorms without a weight)
    norm: str = "rms"
    # the dense MLP's kind: act(gate) * up (GatedMLP), or False act(up) alone (UngatedMLP:
    # Arcee's), its `hidden_act` then a name of MLP_ACTIVATIONS
    gated_mlp: bool = True
    # attention and the MLP read the same normed input and both outputs join the stream (Cohere:
    # one norm a layer); False: one after the other, each with its own norm
    parallel_block: bool = False
    # with parallel_block: the two outputs summed first and the sum added to the stream (Phi,
    # GPT-NeoX: attn + mlp + residual), where Cohere adds attention's to the stream first
    parallel_outputs_summed: bool = False
    # with parallel_block: the MLP reads a norm of the layer's input of its own (GPT-NeoX's
    # post_attention_layernorm), not attention's input norm
    parallel_mlp_norm: bool = False
    sandwich_norms: bool = False  # four norms a layer (Gemma 2/3): also after attention and MLP
    # with sandwich_norms, False: only the norms after attention and the MLP (OLMo 2, EXAONE 4)
    pre_norms: bool = True
    # q/k norms over the whole projection rather than each head (OLMo 2; qk_norm True too)
    projection_qk_norm: bool = False
    # q/k norms applied to the rotated q and k rather than before the rotation (Hunyuan)
    qk_norm_after_rope: bool = False
    # q/k LayerNorms (no bias) with a weight of each head's own, `{q,k}_norm.norms.{h}`
    # (StableLM's qk_layernorm); qk_norm stays False
    per_head_qk_layernorm: bool = False
    # the rotated q and k normed per head without a weight (an L2 norm over the head's mean
    # square), in the layers that rotate (Llama 4's use_qk_norm); qk_norm stays False
    qk_l2_norm: bool = False
    embed_scale: float | None = None  # embeddings multiplied by it (Gemma: sqrt(hidden))
    attention_scale: float | None = None  # the query scale; None: head_dim ** -0.5
    attn_softcap: float | None = None  # scores s -> cap * tanh(s / cap) (Gemma 2)
    # each query, once rotated, scaled by its position (Ministral 3's and Mistral 4's
    # llama_4_scaling_beta, Llama 4's attn_temperature_tuning); None: not scaled by position
    query_position_scale: QueryPositionScale | None = None
    # Per layer whether query_position_scale applies (Llama 4: the layers without rotary);
    # empty: every layer.
    position_scaled_layers: tuple[bool, ...] = ()
    # Per layer the attention chunk it attends within (Llama 4's chunked_attention layers: a
    # query sees the keys of its own chunk of that many positions), or None; empty: none.
    layer_chunks: tuple[int | None, ...] = ()
    # a learned logit per query head in every softmax's denominator (gpt-oss's `sinks`)
    attention_sinks: bool = False
    # the layers that have those sinks where only some do (MiMo-V2-Flash's sliding layers);
    # empty: every layer, with attention_sinks
    sink_layers: tuple[bool, ...] = ()
    # ALiBi's slope of every query head (BLOOM's, MPT's: shard/layers/alibi.py): head h adds
    # slope * (key position - query position) to its scores; empty: no ALiBi
    alibi_slopes: tuple[float, ...] = ()
    # values narrower than queries and keys (MiMo-V2-Flash's v_head_dim); None: head_dim. The
    # cache keeps them zero-padded to head_dim, so every kernel attends as it does
    value_head_dim: int | None = None
    # values times this after their projection (MiMo-V2-Flash's attention_value_scale)
    value_scale: float | None = None
    # attention's output, before o_proj, times sigmoid of a projection of the layer's input, one
    # gate per head dim (AFMoE's gate_proj)
    attention_output_gate: bool = False
    # ... one gate a head (LFM3's g_proj: hidden -> heads), each head's output times its gate
    attention_head_gate: bool = False
    # the output gate's function: "sigmoid" (AFMoE's, LFM3's), or "softplus" in float32, rounded
    # to the dtype before it multiplies (Laguna's)
    attention_gate_activation: str = "sigmoid"
    # the same gate, from q_proj: its rows hold each head's query and then that head's gate
    # (Qwen3.5, Qwen3-Next)
    query_gate: bool = False
    final_softcap: float | None = None  # logits likewise (Gemma 2 and 3)
    # the LM head adds a bias (Phi's lm_head.bias), its own even where its weight is tied
    lm_head_bias: bool = False
    # q, k and v clamped to [-clip, clip] right after their projection (OLMo's clip_qkv)
    clip_qkv: float | None = None
    # one fused q/k/v tensor whose rows hold each head's q, k and v in turn (GPT-NeoX's
    # query_key_value), not every q row, then k's, then v's
    qkv_by_head: bool = False
    # a learned embedding of each absolute position added to the token's (GPTBigCode's wpe),
    # `embed_positions` in the names table; usually with no rotary in any layer
    learned_positions: bool = False
    # the table's row of position p is p + this (OPT's first two rows are never read)
    learned_position_offset: int = 0
    # Per layer where the rope differs by layer type (Gemma 3's local and global bases);
    # empty: `rope` in every layer.
    layer_ropes: tuple[RopeConfig, ...] = ()
    # Per layer whether it rotates q and k at all (SmolLM3's no_rope_layers leave every fourth
    # without position encoding); empty: every layer does.
    rotary_layers: tuple[bool, ...] = ()
    # Each attention and MLP output is multiplied by this before its residual add (Granite's
    # residual_multiplier); None: added as it is.
    residual_scale: float | None = None
    # The logits are divided by this (Granite's logits_scaling); None: as the LM head gives them.
    logits_divisor: float | None = None
    # ... or multiplied by this (Cohere's logit_scale)
    logits_scale: float | None = None
    # The Mixture-of-Experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE); None: every MLP dense.
    moe: MoeConfig | None = None
    # Multi-head latent attention in every layer (DeepSeek); None: the q/k/v `Attention`.
    mla: MlaConfig | None = None
    # Gated DeltaNet in the layers it names (Qwen3.5); None: softmax attention in every layer.
    linear_attention: LinearAttentionConfig | None = None
    # Kimi Delta Attention in the layers it names (Kimi Linear, Ling hybrids); None: none.
    kda: KdaConfig | None = None
    # Mamba 2 mixers in the layers it names (Granite 4.0-H); None: none.
    mamba: MambaConfig | None = None
    # Mamba 1 mixers in the layers it names (Mamba, FalconMamba, Jamba); None: none.
    mamba1: Mamba1Config | None = None
    # LFM2's gated short convolutions in the layers they name (a state per sequence, no KV)
    short_conv: ShortConvConfig | None = None
    # Per layer whether it is an MLP block alone, no mixer (NemotronH's one-module layers:
    # shard/models/nemotron_h.py); empty: none is.
    mlp_layers: tuple[bool, ...] = ()
    # Per layer (KV heads, head dims) where the layers differ (Gemma 4's global layers: wider
    # heads, fewer KV heads); empty: num_kv_heads and head_dim in every layer.
    layer_attention_shapes: tuple[tuple[int, int], ...] = ()
    # Per layer its query heads where the layers differ (Laguna's num_attention_heads_per_layer;
    # the KV heads stay num_kv_heads); empty: num_heads in every layer.
    layer_heads: tuple[int, ...] = ()
    # Per layer whether its values are its keys' projection, before the key norm and rotary (no
    # v_proj: Gemma 4's attention_k_eq_v in its global layers); empty: none are.
    values_from_keys: tuple[bool, ...] = ()
    # the values normed per head, without a weight (Gemma 4's v_norm)
    value_norm: bool = False
    # Per layer the earlier layer whose keys and values (this step's and cached) it attends
    # over, computing and caching none of its own (Gemma 4's num_kv_shared_layers); empty:
    # every layer its own.
    kv_sources: tuple[int | None, ...] = ()
    # Gemma 4's per-layer embeddings; None: none.
    per_layer_inputs: PerLayerInputConfig | None = None
    # Gemma 3n's alternating updates of several streams (shard/models/gemma3n.py)
    altup: AltUpConfig | None = None
    # Falcon-H1's muP multipliers around its layers' parts (shard/models/falcon_h1.py)
    falcon_h1: FalconH1Scales | None = None
    # the stream between the layers kept in float32 (pure Mamba 2's residual_in_fp32)
    residual_in_float32: bool = False

    def sinks_in(self, layer: int) -> bool:
        return self.attention_sinks and (not self.sink_layers or self.sink_layers[layer])

    def heads_of(self, layer: int) -> int:
        return self.layer_heads[layer] if self.layer_heads else self.num_heads

    def head_dim_of(self, layer: int) -> int:
        return (
            self.layer_attention_shapes[layer][1] if self.layer_attention_shapes else self.head_dim
        )

    def kv_heads_of(self, layer: int) -> int:
        if self.layer_attention_shapes:
            return self.layer_attention_shapes[layer][0]
        return self.num_kv_heads

    def kv_source(self, layer: int) -> int | None:
        """The layer whose keys and values `layer` reads (None: its own)."""
        return self.kv_sources[layer] if self.kv_sources else None

    def linear(self, layer: int) -> bool:
        """Whether `layer` mixes tokens with linear attention (a state per sequence, no KV)."""
        return self.linear_attention is not None and self.linear_attention.layers[layer]

    def kda_layer(self, layer: int) -> bool:
        """Whether `layer` mixes tokens with Kimi Delta Attention (a state per sequence)."""
        return self.kda is not None and self.kda.layers[layer]

    def mamba_layer(self, layer: int) -> bool:
        """Whether `layer` mixes tokens with a Mamba 2 mixer (a state per sequence, no KV)."""
        return self.mamba is not None and self.mamba.layers[layer]

    def mamba1_layer(self, layer: int) -> bool:
        """Whether `layer` mixes tokens with a Mamba 1 mixer (a state per sequence, no KV)."""
        return self.mamba1 is not None and self.mamba1.layers[layer]

    def short_conv_layer(self, layer: int) -> bool:
        """Whether `layer` mixes tokens with LFM2's short convolution (a state per sequence)."""
        return self.short_conv is not None and self.short_conv.layers[layer]

    def sparse_mlp(self, layer: int) -> bool:
        return self.moe is not None and self.moe.sparse_layers[layer]

    def rope_of(self, layer: int) -> RopeConfig:
        return self.layer_ropes[layer] if self.layer_ropes else self.rope

    def rotates(self, layer: int) -> bool:
        return self.rotary_layers[layer] if self.rotary_layers else True

    def position_scale_of(self, layer: int) -> QueryPositionScale | None:
        if self.position_scaled_layers and not self.position_scaled_layers[layer]:
            return None
        return self.query_position_scale

    def chunk_of(self, layer: int) -> int | None:
        return self.layer_chunks[layer] if self.layer_chunks else None

    @property
    def rope_regime_boundary(self) -> int:
        """The prompt length past which a sequence's K vectors are all rotated otherwise:
        longrope's original_max_position_embeddings (its long tables), 0 when no layer's rope
        depends on the sequence's length. The router keeps prompts of either side from sharing
        cached prefix blocks (InfoResponse.rope_regime_boundary)."""
        for rope in self.layer_ropes or (self.rope,):
            if rope.rope_type == "longrope":
                return rope.original_max_position_embeddings
        return 0

    @classmethod
    def from_dict(
        cls,
        config: dict[str, Any],
        *,
        architecture: str,
        eos_token_ids: list[int],
        qkv_bias_default: bool = False,
        qk_norm: bool = False,
        quantization: QuantizationConfig | None = None,
        gated_mlp: bool = True,
    ) -> ModelConfig:
        """`gated_mlp` False: the dense MLP is act(up) (UngatedMLP), `hidden_act` an ungated
        MLP's activation (relu2 among them)."""
        num_heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // num_heads
        attention_bias = config.get("attention_bias")
        sliding_window = config.get("sliding_window")
        if config.get("use_sliding_window") is False:  # Qwen2 keeps the value but disables it
            sliding_window = None
        max_pos = config.get("max_position_embeddings", 2048)
        num_layers = config["num_hidden_layers"]
        layer_types = config.get("layer_types") or ["sliding_attention"] * num_layers
        if len(layer_types) != num_layers:
            raise ValueError(f"layer_types names {len(layer_types)} layers, not {num_layers}")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be at least 1, got {sliding_window}")
        layer_windows = tuple(
            sliding_window if kind == "sliding_attention" else None for kind in layer_types
        )
        rope_params = config.get("rope_parameters")
        layer_ropes: tuple[RopeConfig, ...] = ()
        if isinstance(rope_params, dict) and any(isinstance(v, dict) for v in rope_params.values()):
            # transformers 5 keys them by layer type (Gemma 3): one table per type present
            ropes = {
                kind: RopeConfig.from_config_dict(config, head_dim, layer_type=kind)
                for kind in dict.fromkeys(layer_types)
            }
            layer_ropes = tuple(ropes[kind] for kind in layer_types)
            rope = layer_ropes[0]
        else:
            rope = RopeConfig.from_config_dict(config, head_dim)
        return cls(
            architecture=architecture,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            # absent where every MLP is an expert block (Solar Open)
            intermediate_size=config.get("intermediate_size") or 0,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias_default if attention_bias is None else bool(attention_bias),
            o_bias=bool(attention_bias),
            qk_norm=qk_norm,
            mlp_bias=bool(config.get("mlp_bias", False)),
            hidden_act=(gated_activation if gated_mlp else mlp_activation)(
                config.get("hidden_act", "silu")
            ),
            gated_mlp=gated_mlp,
            rope=rope,
            sliding_window=sliding_window,
            layer_windows=layer_windows,
            eos_token_ids=tuple(eos_token_ids),
            quantization=quantization,
            layer_ropes=layer_ropes,
        )

    @classmethod
    def load(
        cls, model_dir: Path, *, qkv_bias_default: bool = False, qk_norm: bool = False
    ) -> ModelConfig:
        config = read_config_dict(model_dir)
        return cls.from_dict(
            config,
            architecture=read_architecture(model_dir),
            eos_token_ids=read_eos_token_ids(model_dir, config),
            qkv_bias_default=qkv_bias_default,
            qk_norm=qk_norm,
            quantization=read_quantization(model_dir),
        )
