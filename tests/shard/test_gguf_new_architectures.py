"""Gemma 2, Gemma 3, Phi-3, Qwen2-MoE, Qwen3-MoE and Mixtral GGUFs written as llama.cpp's
converter writes them (tests/gguf_writer.py: the gguf package's own tensor names, Gemma's norms
stored as 1 + w, Phi-3's fused projections and longrope factor tensors, the experts stacked per
layer, each converter's metadata).

An F32 file must compute what the checkpoint it was written from computes (transformers on that
checkpoint): that holds the config the shard reads from the file (shard/gguf/config.py) to the
model's own. A quantized file must compute what transformers computes from the same file's
dequantized tensors, renamed and shifted by transformers' own GGUF loader, under that config
(transformers' GGUF config reader alone leaves the soft-caps, Gemma 3's global rope scaling,
Phi-3's partial rotary and longrope, and the experts' sizes at class defaults). transformers
reads a Mixtral file (a `llama` file with experts) as a Llama without them, so Mixtral has the
F32 comparison only.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from paged_helpers import assert_equals_reference, run_paged
from test_gguf_models import split_worker
from test_models_vs_transformers import prompts
from test_tensor_parallel import free_port

from launcher.tiny_models import build_model
from shard.distributed import Distributed
from shard.gguf.checks import GgufError, inspect_gguf
from shard.gguf.config import file_config
from shard.gguf.convert import write_model_dir
from shard.models import load_model
from tests.gguf_writer import write_gguf
from tests.shard.tiny_model_cases import GGUF_MODELS as SOURCES

CPU = torch.device("cpu")
STEPS = 4
ATOL = 1e-4


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(name, qtype) -> (the HF source, the GGUF file, the directory the launcher serves)."""
    built: dict[tuple[str, str], tuple[Path, Path, Path]] = {}

    def get(name: str, qtype: str) -> tuple[Path, Path, Path]:
        if (name, qtype) not in built:
            arch, cls, overrides = SOURCES[name]
            root = tmp_path_factory.mktemp(f"gguf-{name}-{qtype}")
            source = build_model(root / "hf", cls, **overrides)
            # Gemma's files carry SentencePiece vocabularies (a byte-level one is refused below).
            path = write_gguf(
                source, root / f"tiny-{qtype}.gguf", qtype, architecture=arch,
                sentencepiece=arch.startswith("gemma"),
            )  # fmt: skip
            info = inspect_gguf(path)
            assert info.hf_architecture == cls
            served = root / "served"
            served.mkdir()
            write_model_dir(info, served)
            built[name, qtype] = source, path, served
        return built[name, qtype]

    return get


def serve(served: Path):
    model = load_model(served, dtype=torch.float32, device=CPU, dist=Distributed())
    batch = prompts(model.vocab_size)
    return batch, *run_paged(model, batch, STEPS, seed=5)


@pytest.mark.parametrize("name", list(SOURCES))
def test_f32_file_computes_what_its_source_checkpoint_computes(written, name):
    from transformers import AutoModelForCausalLM

    source, _, served = written(name, "F32")
    ref = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    batch, logits, tokens = serve(served)
    assert_equals_reference(ref, batch, logits, tokens, ATOL)


@pytest.mark.parametrize(
    "name, qtype",
    [("gemma2", "Q8_0"), ("gemma3", "Q4_1"), ("phi3", "Q8_0"), ("qwen2moe", "Q8_0"),
     ("qwen3moe", "Q4_1")],
)  # fmt: skip
def test_quantized_file_equals_transformers_on_its_tensors(written, name, qtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    _, path, served = written(name, qtype)
    ref = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, config=AutoConfig.from_pretrained(served),
        dtype=torch.float32,
    ).eval()  # fmt: skip
    batch, logits, tokens = serve(served)
    assert_equals_reference(ref, batch, logits, tokens, ATOL)


def test_mixtral_file_with_one_tensor_per_expert_computes_what_its_source_computes(tmp_path):
    # Mixtral GGUFs converted before llama.cpp stacked the experts (blk.L.ffn_gate.E.weight).
    from transformers import AutoModelForCausalLM

    arch, cls, overrides = SOURCES["mixtral"]
    source = build_model(tmp_path / "hf", cls, **overrides)
    path = write_gguf(source, tmp_path / "legacy.gguf", "F32", architecture=arch,
                      legacy_experts=True)  # fmt: skip
    served = tmp_path / "served"
    served.mkdir()
    write_model_dir(inspect_gguf(path), served)
    ref = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    batch, logits, tokens = serve(served)
    assert_equals_reference(ref, batch, logits, tokens, ATOL)


def test_stacked_experts_split_over_two_ranks_by_expert_equal_one(written, tmp_path):
    # Each rank reads its own experts out of the file's stacked tensors (--expert-parallel).
    _, _, served = written("qwen3moe", "Q4_1")
    mp.spawn(split_worker, args=(free_port(), str(served), str(tmp_path), True), nprocs=2)
    batch, logits, tokens = serve(served)
    for rank in range(2):
        ep_logits, ep_tokens = torch.load(tmp_path / f"{rank}.pt")
        assert ep_tokens == tokens
        for got, want in zip(ep_logits, logits, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_a_vocabulary_transformers_cannot_encode_with_is_refused_at_conversion(written, tmp_path):
    # transformers builds Gemma's tokenizer class over a byte-level vocabulary, which then fails
    # every encode: refused when the launcher converts the file, not as a 500 per request.
    source, _, _ = written("gemma2", "F32")
    path = write_gguf(source, tmp_path / "bytes.gguf", "F32", architecture="gemma2")
    with pytest.raises(GgufError, match=r"bytes.gguf: the tokenizer transformers builds .*'gpt2'"):
        write_model_dir(inspect_gguf(path), tmp_path / "served")


class FakeReader:
    """The metadata fields of a GGUF header (gguf.GGUFReader's get_field), no tensors."""

    def __init__(self, fields: dict) -> None:
        self.fields, self.tensors = fields, []

    def get_field(self, key: str):  # noqa: ANN201
        if key not in self.fields:
            return None
        return SimpleNamespace(contents=lambda: self.fields[key])


def gemma_header(arch: str, layers: int, window: int | None, **extra) -> FakeReader:
    fields = {
        f"{arch}.block_count": layers, f"{arch}.embedding_length": 4608,
        f"{arch}.attention.head_count": 32, f"{arch}.attention.key_length": 128,
        f"{arch}.rope.freq_base": 1e6, **{f"{arch}.{k}": v for k, v in extra.items()},
    }  # fmt: skip
    if window is not None:
        fields[f"{arch}.attention.sliding_window"] = window
    return FakeReader(fields)


def test_gemma_query_scale_follows_llama_cpps_rule_for_27b():
    # Gemma 2 27B (46 layers) scales queries by (hidden / heads) ** -0.5 = 144 ** -0.5, the
    # other sizes by head_dim ** -0.5; likewise Gemma 3 27B (62 layers).
    assert file_config(gemma_header("gemma2", 46, 4096), "gemma2")["query_pre_attn_scalar"] == 144
    assert file_config(gemma_header("gemma2", 26, 4096), "gemma2")["query_pre_attn_scalar"] == 128
    assert file_config(gemma_header("gemma3", 62, 1024), "gemma3")["query_pre_attn_scalar"] == 144
    assert file_config(gemma_header("gemma3", 34, 1024), "gemma3")["query_pre_attn_scalar"] == 128


def test_gemma_layer_types_and_ropes_come_from_the_window_and_pattern():
    two = file_config(
        gemma_header("gemma2", 4, 4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
        "gemma2",
    )
    assert two["layer_types"] == ["sliding_attention", "full_attention"] * 2
    assert (two["attn_logit_softcapping"], two["final_logit_softcapping"]) == (50.0, 30.0)
    scaling = {"rope.scaling.type": "linear", "rope.scaling.factor": 8.0}
    three = file_config(gemma_header("gemma3", 12, 1024, **scaling), "gemma3")
    assert three["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 2
    assert three["final_logit_softcapping"] is None and three["sliding_window"] == 1024
    assert three["rope_parameters"] == {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
    }
    # A file without a window (llama.cpp then attends fully in every layer).
    assert (
        file_config(gemma_header("gemma3", 6, None), "gemma3")["layer_types"]
        == ["full_attention"] * 6
    )


def test_phi3_without_longrope_tensors_rotates_the_files_dimensions_plainly():
    reader = FakeReader({
        "phi3.embedding_length": 3072, "phi3.attention.head_count": 24,
        "phi3.rope.dimension_count": 96, "phi3.context_length": 131072,
        "phi3.rope.scaling.original_context_length": 4096, "phi3.rope.freq_base": 10000.0,
        "phi3.attention.sliding_window": 0,
    })  # fmt: skip
    config = file_config(reader, "phi3")
    assert config["rope_parameters"] == {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
    }  # fmt: skip
    assert config["sliding_window"] is None  # 0: Phi-4's "no window"
    assert (config["max_position_embeddings"], config["original_max_position_embeddings"]) == (
        131072, 4096,
    )  # fmt: skip
    assert file_config(reader, "llama") == {}  # the families transformers reads right


def test_qwen_moe_dense_layers_are_those_without_stacked_experts():
    reader = FakeReader({
        "qwen2moe.block_count": 3, "qwen2moe.expert_feed_forward_length": 1408,
        "qwen2moe.expert_shared_feed_forward_length": 5632,
    })  # fmt: skip
    reader.tensors = [SimpleNamespace(name=f"blk.{i}.ffn_gate_exps.weight") for i in (0, 2)]
    assert file_config(reader, "qwen2moe") == {
        "moe_intermediate_size": 1408, "norm_topk_prob": False, "decoder_sparse_step": 1,
        "mlp_only_layers": [1], "shared_expert_intermediate_size": 5632,
    }  # fmt: skip
    reader.fields["qwen2moe.expert_weights_norm"] = True  # the file's word wins
    assert file_config(reader, "qwen2moe")["norm_topk_prob"] is True
