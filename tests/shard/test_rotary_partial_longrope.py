"""Rotary embedding for Phi-3 / Phi-3.5 / Phi-4-mini (partial rotary, longrope) and Gemma 3 (rope
parameters per layer type) against transformers' own rotary modules on the same configs, on the
torch path, the native CPU kernel's and the Triton kernel's (interpreted on a CPU).

longrope's choice between its short and long tables is per token here (by the token's own
sequence length, see shard/layers/rotary.py), where transformers makes it per forward pass from
max(position_ids) + 1: the references are transformers run on one sequence at a time (a whole
prompt, or one decode token), which is what the per-token choice must reproduce whatever the
batch around the token."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma3TextConfig, Phi3Config
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.phi3 import modeling_phi3

import shard.layers.rotary
import shard.platforms.cpu.native.build
from shard.attention.metadata import AttentionMetadata, MixedMetadata
from shard.batch import Batch
from shard.layers.rotary import RopeConfig, RotaryEmbedding
from shard.requests import NewRequest
from shard.sampling.params import SamplingParams
from shard.step_inputs import build_step_inputs, step_lengths
from tests.shard.paged_helpers import meta_on

CPU = torch.device("cpu")
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32
ORIGINAL_MAX, MAX_POS = 32, 160
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _phi3(partial: float = 1.0, longrope: bool = False, **rope: object) -> Phi3Config:
    params: dict[str, object] = {}
    if longrope:
        half = int(HEAD_DIM * partial) // 2
        # Factors far apart, so that a token given the wrong set is far off.
        params = {
            "rope_type": "longrope",
            "short_factor": [1.0 + 0.05 * i for i in range(half)],
            "long_factor": [2.0 + 1.5 * i for i in range(half)],
            **rope,
        }
    return Phi3Config(
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POS,
        original_max_position_embeddings=ORIGINAL_MAX,
        partial_rotary_factor=partial,
        rope_parameters=params or None,
    )


def _ours(config, layer_type: str | None = None) -> RotaryEmbedding:
    rope = RopeConfig.from_config_dict(config.to_dict(), HEAD_DIM, layer_type=layer_type)
    return RotaryEmbedding(rope, CPU)


def _fused(tokens: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k as neighbouring views of one qkv row, as the fused projection lays them out."""
    gen = torch.Generator().manual_seed(seed)
    rows = (torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=gen) * 4).to(dtype)
    q = rows[:, : HEADS * HEAD_DIM].view(tokens, HEADS, HEAD_DIM)
    k = rows[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM].view(tokens, KV_HEADS, HEAD_DIM)
    return q, k


def _apply(module, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """transformers' apply_rotary_pos_emb of `module` on our [T, heads, D] layout, cos/sin [T, R]
    (already in q's dtype, as transformers' rotary modules return them)."""
    q_ref, k_ref = module.apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None]
    )
    return q_ref[0].transpose(0, 1), k_ref[0].transpose(0, 1)


def _phi3_reference(ref, q, k, positions: torch.Tensor, seq_lens: list[int]):
    """transformers on one sequence at a time: token t (at positions[t]) rotated as in a forward
    pass over its sequence of seq_lens[t] tokens (the whole prompt; for a decode token at p,
    p + 1: a pass whose largest position is p)."""
    cos, sin = [], []
    for p, n in zip(positions.tolist(), seq_lens, strict=True):
        assert p < n
        c, s = ref(q, torch.arange(n)[None])
        cos.append(c[0, p])
        sin.append(s[0, p])
    return _apply(modeling_phi3, q, k, torch.stack(cos), torch.stack(sin))


def _fused_rounding(dtype: torch.dtype, want: torch.Tensor) -> dict[str, float]:
    """A compiled kernel's a * b + c is one fused multiply-add, its product not rounded alone:
    within a rounding step at the operands' scale (|cos|, |sin| <= 1: the output's)."""
    return dict(atol=2 * torch.finfo(dtype).eps * float(want.abs().max()), rtol=0)


def _assert_same(got, want, dtype: torch.dtype) -> None:
    # The same products and sums, rounded where transformers rounds them, from tables computed
    # by the same formulas: exact in every dtype.
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        torch.testing.assert_close(g, w, atol=0, rtol=0)


# -- partial rotary -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("partial", [0.5, 0.75])
def test_partial_rotary_matches_phi3(partial, dtype, rotary_path):
    config = _phi3(partial)
    ours, ref = _ours(config), modeling_phi3.Phi3RotaryEmbedding(config)
    assert ours.rotary_dim == int(HEAD_DIM * partial) and ours.cos.shape[1] == ours.rotary_dim
    assert not ours.plain
    positions = torch.tensor([0, 1, 7, 31, 32, 100, 159, 3])
    q, k = _fused(len(positions), dtype, seed=int(partial * 100))
    q_before = q.clone()
    cos, sin = ref(q, positions[None])
    want = _apply(modeling_phi3, q, k, cos[0], sin[0])
    with torch.inference_mode():
        joint = ours(positions, q, k)  # q and k neighbours: one pass over both
        separate = ours(positions, q.contiguous(), k.contiguous())
    _assert_same(joint, want, dtype)
    _assert_same(separate, want, dtype)
    # The dims past rotary_dim pass through untouched, and the input is left as it was.
    assert torch.equal(joint[0][..., ours.rotary_dim :], q_before[..., ours.rotary_dim :])
    assert torch.equal(q, q_before)


def test_full_rotary_stays_plain():
    for config in (_phi3(1.0), Phi3Config(hidden_size=128, num_attention_heads=4)):
        ours = _ours(config)
        assert ours.plain and ours.rotary_dim == HEAD_DIM
    linear = RopeConfig(head_dim=8, max_position_embeddings=16, rope_type="linear", factor=2.0)
    assert RotaryEmbedding(linear, CPU).plain


# -- longrope -----------------------------------------------------------------------------------


def _prefill_meta(q_lens: list[int], stops: list[int], seq_lens: list[int] | None):
    """Prefill metadata for rows running q_lens[i] tokens up to stops[i] (what attention reads
    is not used by the rotary: empty tables and slots)."""
    cu = torch.tensor([0, *q_lens]).cumsum(0).to(torch.int32)
    return AttentionMetadata(
        is_prefill=True,
        slot_mapping=torch.zeros(sum(q_lens), dtype=torch.int64),
        block_tables=torch.zeros(len(q_lens), 1, dtype=torch.int32),
        context_lens=torch.tensor(stops, dtype=torch.int32),
        cu_seqlens_q=cu,
        max_seqlen_q=max(q_lens),
        max_seqlen_k=max(stops),
        seq_lens=None if seq_lens is None else torch.tensor(seq_lens, dtype=torch.int32),
    )


def _decode_meta(positions: list[int]) -> AttentionMetadata:
    # As a captured CUDA graph's: no seq_lens, so position + 1.
    return AttentionMetadata(
        is_prefill=False,
        slot_mapping=torch.zeros(len(positions), dtype=torch.int64),
        block_tables=torch.zeros(len(positions), 1, dtype=torch.int32),
        context_lens=torch.tensor(positions, dtype=torch.int32) + 1,
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("partial", [1.0, 0.75])  # Phi-3.5-mini, Phi-4-mini
def test_longrope_picks_each_tokens_tables_as_transformers_does(partial, dtype, rotary_path):
    config = _phi3(partial, longrope=True)
    ours, ref = _ours(config), modeling_phi3.Phi3RotaryEmbedding(config)
    assert not ours.plain and ours.long_offset == ORIGINAL_MAX
    # One mixed step: prompt rows first, then decode rows.
    #  row 0: a 40-token prompt (> 32) whole: every token long;
    #  row 1: a 20-token prompt whole: short;
    #  row 2: the first chunk (positions 0..11) of a 45-token prompt: long, as the whole prompt;
    #  row 3: the second chunk (positions 12..29) of a 30-token prompt: short;
    #  decode rows at positions 30, 31 (short: 31 + 1 is not past 32), 32 and 120 (long).
    prompts = [(0, 40, 40), (0, 20, 20), (0, 12, 45), (12, 30, 30)]  # start, stop, prompt length
    decodes = [30, 31, 32, 120]
    positions = torch.cat([torch.arange(a, b) for a, b, _ in prompts] + [torch.tensor(decodes)])
    seq_lens = [n for a, b, n in prompts for _ in range(a, b)] + [p + 1 for p in decodes]
    prefill = _prefill_meta(
        [b - a for a, b, _ in prompts], [b for _, b, _ in prompts], [n for _, _, n in prompts]
    )
    n_prefill = int(prefill.cu_seqlens_q[-1])
    meta = MixedMetadata(
        slot_mapping=torch.zeros(len(positions), dtype=torch.int64),
        prefill=prefill,
        decode=_decode_meta(decodes),
        num_prefill_tokens=n_prefill,
    )
    q, k = _fused(len(positions), dtype, seed=3)
    want = _phi3_reference(ref, q, k, positions, seq_lens)
    with torch.inference_mode():
        got = ours(positions, q, k, meta)
        again = ours(positions, q, k, meta)  # the next layer: rows and tables kept
    _assert_same(got, want, dtype)
    _assert_same(again, want, dtype)
    # The case is real: below original_max (where both tables have rows), the other table gives
    # every token but those at position 0 other values.
    flipped = [
        ORIGINAL_MAX + 1 if n <= ORIGINAL_MAX else p + 1
        for p, n in zip(positions.tolist(), seq_lens, strict=True)
    ]
    both = (positions > 0) & (positions < ORIGINAL_MAX)
    wrong = _phi3_reference(
        ref,
        q[both],
        k[both],
        positions[both],
        [n for n, b in zip(flipped, both.tolist(), strict=True) if b],
    )
    assert (got[0][both] != wrong[0]).flatten(1).any(1).all()

    # Each part alone, as a pure prefill or decode step, gives each token the same rotation.
    with torch.inference_mode():
        alone_p = ours(positions[:n_prefill], q[:n_prefill], k[:n_prefill], prefill)
        alone_d = ours(positions[n_prefill:], q[n_prefill:], k[n_prefill:], meta.decode)
    _assert_same(alone_p, (want[0][:n_prefill], want[1][:n_prefill]), dtype)
    _assert_same(alone_d, (want[0][n_prefill:], want[1][n_prefill:]), dtype)


def test_longrope_without_seq_lens_reads_each_tokens_context():
    # Other metadata builders leave seq_lens None: a prefill token then counts its row's
    # context after the step, a token without metadata position + 1 (its decode).
    config = _phi3(longrope=True)
    ours, ref = _ours(config), modeling_phi3.Phi3RotaryEmbedding(config)
    positions = torch.cat([torch.arange(0, 30), torch.arange(30, 40)])
    meta = _prefill_meta([30, 10], [30, 40], seq_lens=None)
    q, k = _fused(len(positions), torch.float32, seed=4)
    want = _phi3_reference(ref, q, k, positions, [30] * 30 + [40] * 10)
    _assert_same(ours(positions, q, k, meta), want, torch.float32)
    decodes = torch.tensor([5, 31, 32, 150])
    q, k = _fused(4, torch.float32, seed=5)
    want = _phi3_reference(ref, q, k, decodes, [6, 32, 33, 151])
    _assert_same(ours(decodes, q, k), want, torch.float32)
    _assert_same(ours(decodes, q, k, _decode_meta(decodes.tolist())), want, torch.float32)


def _request(rid: int, prompt_len: int, prefix_len: int = 0) -> NewRequest:
    return NewRequest(
        id=rid,
        input_ids=[(7 * rid + i) % 50 for i in range(prompt_len)],
        blocks=[0],
        slots=list(range(prompt_len + 4)),
        sampling=SamplingParams(),
        prefix_len=prefix_len,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_longrope_through_the_step_inputs_of_a_chunked_batch(dtype, rotary_path):
    # The runner's own metadata (shard/step_inputs.py): a 50-token prompt computed in chunks of
    # 20 (the first two wholly below 32) is long in every chunk; a 25-token prompt short; a row
    # with a cached prefix of 32 (its last prompt token at 32, a decode-part row) long; one of
    # 31 short; and a one-token chunk in the middle of a 40-token prompt (a decode-part row too)
    # long, as the rest of its prompt.
    config = _phi3(0.75, longrope=True)
    ours, ref = _ours(config), modeling_phi3.Phi3RotaryEmbedding(config)
    batch = Batch.start(
        1,
        [
            _request(0, 50),
            _request(1, 25),
            _request(2, 33, 32),
            _request(3, 32, 31),
            _request(4, 40, 5),
        ],
        CPU,
    )
    lengths = {0: 50, 1: 25, 2: 33, 3: 32, 4: 40}
    for chunk in (20, 20, 10):
        q_lens = step_lengths(batch, {0: chunk, 4: 1})
        inputs = build_step_inputs(batch, q_lens)
        rows = inputs.token_rows.tolist()
        seq_lens = [lengths[batch.requests[r].id] for r in rows]
        q, k = _fused(len(rows), dtype, seed=chunk)
        want = _phi3_reference(ref, q, k, inputs.positions, seq_lens)
        with torch.inference_mode():
            _assert_same(ours(inputs.positions, q, k, inputs.meta), want, dtype)
        # Only row 0 goes on (and row 4, one token a step); the others are done with.
        batch.cache_lens += q_lens
        batch.cache_lens[1:4] = batch.history_lens[1:4]


def test_longrope_rows_are_traceable_without_a_graph_break():
    # A captured decode step may not read the positions on the host nor branch on them.
    config = _phi3(longrope=True)
    ours, ref = _ours(config), modeling_phi3.Phi3RotaryEmbedding(config)
    positions = torch.tensor([0, 31, 32, 100])
    q, k = _fused(4, torch.float32, seed=6)

    def step(positions, q, k, context_lens):
        meta = AttentionMetadata(
            is_prefill=False,
            slot_mapping=positions,
            block_tables=context_lens[:, None],
            context_lens=context_lens,
            captured=True,
        )
        return ours(positions, q, k, meta)

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    got = compiled(positions, q, k, (positions + 1).int())
    want = _phi3_reference(ref, q, k, positions, [1, 32, 33, 101])
    _assert_same(got, want, torch.float32)

    # A mixed step traces whole too (under --compile the model's forward is compiled).
    positions = torch.tensor([0, 5, 31, 0, 17, 40, 31, 32, 150])
    meta = MixedMetadata(
        slot_mapping=torch.zeros(9, dtype=torch.int64),
        prefill=_prefill_meta([3, 3], [32, 41], seq_lens=[32, 41]),
        decode=_decode_meta([31, 32, 150]),
        num_prefill_tokens=6,
    )
    q, k = _fused(9, torch.float32, seed=9)
    got = torch.compile(ours, backend="eager", fullgraph=True)(positions, q, k, meta)
    want = _phi3_reference(ref, q, k, positions, [32] * 3 + [41] * 3 + [32, 33, 151])
    _assert_same(got, want, torch.float32)


def test_longrope_factor_and_attention_factor_as_transformers_computes_them():
    cases = [
        {},  # factor from max_position_embeddings / original (5), attention factor from it
        {"factor": 2.0},
        {"attention_factor": 1.25},
        {"factor": 1.0},  # no scaling: attention factor 1
    ]
    for extra in cases:
        config = _phi3(longrope=True, **extra)
        rope = RopeConfig.from_config_dict(config.to_dict(), HEAD_DIM)
        ref = modeling_phi3.Phi3RotaryEmbedding(config)
        assert rope.rope_type == "longrope" and rope.original_max_position_embeddings == 32
        assert rope.attention_factor == ref.attention_scaling, extra
        assert torch.equal(rope.inv_freq(long=False), ref.original_inv_freq)
    assert RopeConfig.from_config_dict(_phi3(longrope=True).to_dict(), HEAD_DIM).factor == 5.0


# -- Gemma 3: rope parameters per layer type ------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemma3_layer_types_match_transformers(dtype, rotary_path):
    config = Gemma3TextConfig(
        hidden_size=64,
        head_dim=HEAD_DIM,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        num_hidden_layers=6,
        max_position_embeddings=256,
        rope_scaling={"rope_type": "linear", "factor": 8.0},  # the global layers' (4B-27B)
    )
    ref = modeling_gemma3.Gemma3RotaryEmbedding(config)
    positions = torch.tensor([0, 1, 9, 100, 255, 31])
    q, k = _fused(len(positions), dtype, seed=7)
    got = {}
    for layer_type in ("sliding_attention", "full_attention"):
        ours = _ours(config, layer_type)
        assert ours.plain
        cos, sin = ref(q, positions[None], layer_type)
        want = _apply(modeling_gemma3, q, k, cos[0], sin[0])
        with torch.inference_mode():
            got[layer_type] = ours(positions, q, k)
        _assert_same(got[layer_type], want, dtype)
    local = RopeConfig.from_config_dict(config.to_dict(), HEAD_DIM, layer_type="sliding_attention")
    glob = RopeConfig.from_config_dict(config.to_dict(), HEAD_DIM, layer_type="full_attention")
    assert (local.theta, local.rope_type, local.factor) == (10000.0, "default", 1.0)
    assert (glob.theta, glob.rope_type, glob.factor) == (1e6, "linear", 8.0)
    assert not torch.equal(got["sliding_attention"][0], got["full_attention"][0])


# -- config parsing -----------------------------------------------------------------------------


def test_per_layer_type_parameters_need_their_layer_type():
    config = Gemma3TextConfig(num_hidden_layers=2, head_dim=16).to_dict()
    with pytest.raises(ValueError, match="per layer type.*layer_type"):
        RopeConfig.from_config_dict(config, 16)
    with pytest.raises(ValueError, match="'chunked_attention'.*sliding_attention"):
        RopeConfig.from_config_dict(config, 16, layer_type="chunked_attention")
    nope = {"rope_parameters": {"full_attention": {"rope_type": "default"}, "nope": None}}
    with pytest.raises(ValueError, match="'nope' has rope parameters None"):
        RopeConfig.from_config_dict(nope, 16, layer_type="nope")
    # Flat parameters serve every layer type.
    flat = {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
    assert RopeConfig.from_config_dict(flat, 16, layer_type="full_attention").theta == 5e5


def test_longrope_factor_lists_are_checked():
    good = _phi3(0.75, longrope=True).to_dict()  # rotary_dim 24: 12 factors each

    def with_params(**params):
        config = dict(good)
        config["rope_parameters"] = {**good["rope_parameters"], **params}
        return config

    assert len(RopeConfig.from_config_dict(good, HEAD_DIM).short_factor) == 12
    with pytest.raises(ValueError, match="short_factor has 16 entries, not rotary_dim / 2 = 12"):
        RopeConfig.from_config_dict(with_params(short_factor=[1.0] * 16), HEAD_DIM)
    with pytest.raises(ValueError, match="long_factor has 11 entries"):
        RopeConfig.from_config_dict(with_params(long_factor=[1.0] * 11), HEAD_DIM)
    missing = with_params()
    del missing["rope_parameters"]["long_factor"]
    with pytest.raises(ValueError, match="longrope needs long_factor"):
        RopeConfig.from_config_dict(missing, HEAD_DIM)
    with pytest.raises(ValueError, match="longrope needs short_factor"):
        RopeConfig.from_config_dict(with_params(short_factor="1.0"), HEAD_DIM)
    with pytest.raises(ValueError, match="rotary_dim .* must be even"):
        RopeConfig(head_dim=18, max_position_embeddings=8, partial_rotary_factor=0.5)


def test_phi3_config_json_fields_are_read_as_transformers_reads_them():
    # Phi-3-mini-128k's config.json as written: "su" (longrope's first name), the pretraining
    # length at the top level (which transformers puts before the rope dict's own), the partial
    # factor at the top level too.
    raw = {
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "partial_rotary_factor": 0.75,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "su",
            "short_factor": [1.0] * 48,
            "long_factor": [2.0] * 48,
            "original_max_position_embeddings": 1024,
        },
    }
    rope = RopeConfig.from_config_dict(raw, 128)
    assert (rope.rope_type, rope.rotary_dim, rope.original_max_position_embeddings) == (
        "longrope",
        96,
        4096,
    )
    assert rope.factor == 32.0 and rope.attention_factor == pytest.approx(1.19024, abs=1e-5)


# -- the Triton kernel (compiled on a GPU, interpreted on a CPU) -----------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("partial", [0.5, 0.75, 1.0])
def test_triton_rotary_takes_partial_tables_and_longrope_rows(partial, dtype):
    pytest.importorskip("triton", reason="triton is not installed")
    from shard.platforms.cuda.kernels import interpreting
    from shard.platforms.cuda.kernels.elementwise import rotary_

    device = CPU if interpreting() else torch.device("cuda")
    ours = _ours(_phi3(partial, longrope=True))
    positions = torch.tensor([0, 5, 31, 0, 17, 40, 31, 32, 150])
    meta = _prefill_meta([3, 3], [32, 41], seq_lens=[32, 41])
    meta = MixedMetadata(
        slot_mapping=torch.zeros(9, dtype=torch.int64),
        prefill=meta,
        decode=_decode_meta([31, 32, 150]),
        num_prefill_tokens=6,
    )
    rows = ours._rows(positions, meta)
    assert (rows >= ours.long_offset).tolist() == [0, 0, 0, 1, 1, 1, 0, 1, 1]
    q, k = _fused(len(positions), dtype, seed=8)
    q_before = q.clone()
    want = shard.layers.rotary._rotate(q, *ours._gather(rows, dtype))
    on = q.to(device)  # on a CPU, q itself: rotated in place
    assert rotary_(on, ours.cos.to(device), ours.sin.to(device), rows.to(device)) is on
    got = on.cpu()
    eps = torch.finfo(dtype).eps
    if dtype == torch.bfloat16 and interpreting():
        # The interpreter's fp32 -> bf16 cast does not round to nearest even
        # (tests/kernels/test_elementwise_kernels.py): a few rounding steps at the scale.
        tol = dict(atol=4 * eps * float(want.abs().max()), rtol=0)
    elif interpreting():
        tol = dict(atol=0, rtol=0)
    else:
        tol = _fused_rounding(dtype, want)
    torch.testing.assert_close(got, want, **tol)
    # The dims past rotary_dim are neither read nor written.
    assert torch.equal(got[..., ours.rotary_dim :], q_before[..., ours.rotary_dim :])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the module's CUDA path needs a GPU")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("partial", [0.75, 1.0])
def test_cuda_module_path_matches_transformers(partial, dtype):
    # On CUDA the module rotates fused q/k views in place with the Triton kernel, at the rows
    # longrope chose; separate q and k take the torch form on the GPU.
    config = _phi3(partial, longrope=True)
    rope = RopeConfig.from_config_dict(config.to_dict(), HEAD_DIM)
    ours, ref = (
        RotaryEmbedding(rope, torch.device("cuda")),
        modeling_phi3.Phi3RotaryEmbedding(config),
    )
    positions = torch.tensor([0, 5, 31, 0, 17, 40, 31, 32, 150])
    meta = MixedMetadata(
        slot_mapping=torch.zeros(9, dtype=torch.int64),
        prefill=_prefill_meta([3, 3], [32, 41], seq_lens=[32, 41]),
        decode=_decode_meta([31, 32, 150]),
        num_prefill_tokens=6,
    )
    q, k = _fused(9, dtype, seed=10)
    want = _phi3_reference(ref, q, k, positions, [32] * 3 + [41] * 3 + [32, 33, 151])
    cuda_meta = MixedMetadata(
        slot_mapping=meta.slot_mapping.cuda(),
        prefill=meta_on(meta.prefill, torch.device("cuda")),
        decode=meta_on(meta.decode, torch.device("cuda")),
        num_prefill_tokens=6,
    )
    fused = q._base.cuda()  # q and k are views of one qkv buffer: move it whole
    q_cuda = fused.as_strided(q.shape, q.stride(), q.storage_offset())
    k_cuda = fused.as_strided(k.shape, k.stride(), k.storage_offset())
    with torch.inference_mode():
        # Separate copies first: the joint call rotates the buffer in place.
        separate = ours(positions.cuda(), q_cuda.contiguous(), k_cuda.contiguous(), cuda_meta)
        joint = ours(positions.cuda(), q_cuda, k_cuda, cuda_meta)
    assert joint[0].data_ptr() == q_cuda.data_ptr()  # in place: the Triton kernel ran
    # Compiled, the kernel fuses a product into its sum (tests/kernels/test_elementwise_kernels.py
    # rounded_alike): a rounding step at the operands' scale of transformers'.
    for got in (joint, separate):
        for g, w in zip(got, want, strict=True):
            assert g.dtype == dtype
            torch.testing.assert_close(g.cpu(), w, **_fused_rounding(dtype, w))
