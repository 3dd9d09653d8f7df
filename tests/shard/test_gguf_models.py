"""GGUF files written by the `gguf` package from a tiny random Llama: the shard loads them
(dequantizing at load) and computes what transformers computes from the same file, on one rank
and split over two."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from paged_helpers import assert_equals_reference, run_paged
from test_models_vs_transformers import prompts
from test_tensor_parallel import free_port

from launcher.tiny_models import build_model
from shard.distributed import Distributed, init_distributed
from shard.gguf.checks import GgufError, find_gguf, inspect_gguf
from shard.gguf.convert import write_model_dir
from shard.models import load_model
from tests.gguf_writer import write_gguf

CPU = torch.device("cpu")
STEPS = 4
# Every type is compared with transformers dequantizing the same file, so quantization error
# cancels out: what is left is float32 arithmetic.
ATOL = 1e-4


# GGUF architecture -> the tiny HF model it is written from (Qwen2: biases, tied embeddings;
# Qwen3: per-head q/k norms, and head_dim 128, the only one transformers reads from a Qwen3
# GGUF).
SOURCES = {
    "llama": None,  # the servicer's Llama (GQA)
    "qwen2": ("Qwen2ForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3": ("Qwen3ForCausalLM", dict(num_key_value_heads=2, head_dim=128)),
}


@pytest.fixture(scope="module")
def gguf_dir(servicer_model_dir, tmp_path_factory):
    """(qtype, arch) -> (the GGUF file, the directory the launcher would serve it from)."""
    built: dict[tuple[str, str], tuple[Path, Path]] = {}

    def get(qtype: str, arch: str = "llama") -> tuple[Path, Path]:
        if (qtype, arch) not in built:
            root = tmp_path_factory.mktemp(f"gguf-{arch}-{qtype}")
            source = servicer_model_dir
            if SOURCES[arch] is not None:
                source = build_model(root / "hf", SOURCES[arch][0], **SOURCES[arch][1])
            path = write_gguf(source, root / f"tiny-{qtype}.gguf", qtype, architecture=arch)
            served = root / "served"
            served.mkdir()
            write_model_dir(inspect_gguf(path), served)
            built[qtype, arch] = path, served
        return built[qtype, arch]

    return get


def _transformers(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()


@pytest.mark.parametrize(
    "qtype, arch", [("F32", "llama"), ("F16", "llama"), ("Q4_1", "llama"), ("F32", "qwen2"),
                    ("Q8_0", "qwen3")],
)  # fmt: skip
def test_gguf_logits_and_greedy_tokens_equal_transformers(gguf_dir, qtype, arch):
    path, served = gguf_dir(qtype, arch)
    ours = load_model(served, dtype=torch.float32, device=CPU, dist=Distributed())
    ref = _transformers(path)
    batch = prompts(ours.vocab_size)
    logits, tokens = run_paged(ours, batch, STEPS, seed=5)
    assert_equals_reference(ref, batch, logits, tokens, ATOL)


def test_gguf_metadata_gives_config_tokenizer_and_dtype(gguf_dir, servicer_model_dir):
    from transformers import AutoTokenizer

    path, served = gguf_dir("F16")
    info = inspect_gguf(path)
    assert (info.architecture, info.hf_architecture) == ("llama", "LlamaForCausalLM")
    assert info.tensor_types == {"F32", "F16"} and info.float_dtype == "float16"
    assert inspect_gguf(gguf_dir("Q4_1")[0]).float_dtype == "bfloat16"
    assert inspect_gguf(gguf_dir("F32")[0]).float_dtype == "float32"
    tok, ref = (
        AutoTokenizer.from_pretrained(served),
        AutoTokenizer.from_pretrained(servicer_model_dir),
    )
    text = "The quick brown fox Ünïcödé 🚀"
    assert tok(text).input_ids == ref(text).input_ids
    chat = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(chat, tokenize=False) == ref.apply_chat_template(
        chat, tokenize=False
    )
    assert (served / "model.gguf").resolve() == path.resolve()


def split_worker(
    rank: int, port: int, served: str, out_dir: str, expert_parallel: bool = False
) -> None:
    """One of two ranks serving `served` (tensor parallel, or expert parallel): run_paged's
    logits and tokens saved to out_dir/RANK.pt."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    torch.set_num_threads(1)
    dist = init_distributed(CPU)
    model = load_model(
        Path(served), dtype=torch.float32, device=CPU, dist=dist, expert_parallel=expert_parallel
    )
    torch.save(run_paged(model, prompts(model.vocab_size), STEPS, seed=5), f"{out_dir}/{rank}.pt")
    torch.distributed.barrier()  # both ranks done before either tears gloo down
    torch.distributed.destroy_process_group()


def test_gguf_split_over_two_ranks_equals_one(gguf_dir, tmp_path):
    _, served = gguf_dir("Q4_1")
    mp.spawn(split_worker, args=(free_port(), str(served), str(tmp_path)), nprocs=2)
    one = load_model(served, dtype=torch.float32, device=CPU, dist=Distributed())
    logits, tokens = run_paged(one, prompts(one.vocab_size), STEPS, seed=5)
    for rank in range(2):
        tp_logits, tp_tokens = torch.load(tmp_path / f"{rank}.pt")
        assert tp_tokens == tokens
        for got, want in zip(tp_logits, logits, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


# Architectures the server does not serve: their GGUFs are refused by name.
@pytest.mark.parametrize("architecture", ["falcon", "starcoder2", "mamba"])
def test_unsupported_architecture_is_named(servicer_model_dir, tmp_path, architecture):
    path = write_gguf(servicer_model_dir, tmp_path / "x.gguf", "F32", architecture=architecture)
    with pytest.raises(
        GgufError,
        match=f"x.gguf: GGUF architecture '{architecture}' is not supported; "
        "supported: gemma2, gemma3, llama, phi3, qwen2, qwen2moe, qwen3, qwen3moe$",
    ):
        inspect_gguf(path)


def test_type_the_library_cannot_dequantize_is_named(tmp_path):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(tmp_path / "q81.gguf"), "llama")
    # Q8_1: 40 bytes per block of 32 values; gguf reads it but has no dequantizer for it.
    qtype = gguf.GGMLQuantizationType.Q8_1
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 40), np.uint8), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GgufError, match="type\\(s\\) Q8_1 cannot be dequantized"):
        inspect_gguf(tmp_path / "q81.gguf")


def test_find_gguf_takes_a_file_or_a_directory_holding_exactly_one(tmp_path, servicer_model_dir):
    assert find_gguf(servicer_model_dir) is None  # an HF directory
    (tmp_path / "a.gguf").write_bytes(b"")
    assert find_gguf(tmp_path) == tmp_path / "a.gguf" == find_gguf(tmp_path / "a.gguf")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(GgufError, match=r"several GGUF files \(a.gguf, b.gguf\)"):
        find_gguf(tmp_path)
