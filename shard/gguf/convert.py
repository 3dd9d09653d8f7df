"""A GGUF file -> a directory the shards and the router read like any HF checkpoint.

The config, generation config and tokenizer (its chat template included) come from the file's
metadata through transformers' own GGUF readers, so they are what transformers would build from
the same file. The weights either stay in the GGUF, linked into the directory and dequantized by
each shard at load (`write_model_dir`), or are dequantized once into safetensors
(`write_checkpoint`, which the default model uses so that every later start reads plain bf16).
"""

from __future__ import annotations

import os
from pathlib import Path

from shard.gguf.checks import GgufError, GgufInfo

LINK_NAME = "model.gguf"


def write_metadata(info: GgufInfo, out_dir: Path, dtype: str) -> None:
    """config.json, generation_config.json and the tokenizer files, from the GGUF's metadata."""
    import gguf
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from shard.gguf.config import file_config, mixtral_config

    where, name = str(info.path.parent), info.path.name
    config = AutoConfig.from_pretrained(where, gguf_file=name)
    reader = gguf.GGUFReader(str(info.path))
    if info.hf_architecture == "MixtralForCausalLM":
        config = mixtral_config(config, reader)  # transformers reads it as a plain Llama
    # transformers leaves these unset for GGUF; our registry picks the class by architectures[0]
    # and `--dtype auto` reads the dtype.
    config.architectures = [info.hf_architecture]
    config.dtype = dtype
    if info.head_dim is not None:
        # transformers maps key_length to head_dim for some architectures only (not Qwen3,
        # whose config default of 128 then hides it); the file is the truth.
        config.head_dim = info.head_dim
    # What transformers leaves at class defaults for Gemma 2/3, Phi-3 and the Qwen MoE families
    # (shard/gguf/config.py).
    for key, value in file_config(reader, info.architecture).items():
        setattr(config, key, value)
    if config.pad_token_id is not None and config.pad_token_id >= config.vocab_size:
        config.pad_token_id = None  # a config class's default (Phi-3's 32000), not the file's
    config.save_pretrained(out_dir)
    # The EOS that ends generation (SmolLM2: <|im_end|>), as transformers derives it.
    GenerationConfig.from_model_config(config).save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(where, gguf_file=name).save_pretrained(out_dir)
    try:  # what the router will load: a vocabulary saved wrongly fails every request later
        AutoTokenizer.from_pretrained(out_dir)("Hello, world.")
    except Exception as exc:
        raise GgufError(
            f"{name}: the tokenizer transformers builds from this file's vocabulary (tokenizer "
            f"model {_tokenizer_model(reader)!r} in a {info.architecture!r} file) cannot encode "
            f"text: {exc}"
        ) from exc


def _tokenizer_model(reader) -> str:  # noqa: ANN001 (gguf.GGUFReader)
    field = reader.get_field("tokenizer.ggml.model")
    return "(none)" if field is None else str(field.contents())


def write_model_dir(info: GgufInfo, out_dir: Path) -> None:
    """Metadata plus a link to the GGUF itself: the shards dequantize it at load."""
    write_metadata(info, out_dir, info.float_dtype)
    os.symlink(info.path.resolve(), out_dir / LINK_NAME)


def write_checkpoint(info: GgufInfo, out_dir: Path, dtype: str) -> None:
    """Metadata plus model.safetensors in `dtype`, every tensor dequantized once, with a
    progress bar (a 135M model takes seconds; a 7B one minutes)."""
    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm

    from shard.gguf.source import GgufSource

    write_metadata(info, out_dir, dtype)
    source = GgufSource(info.path)
    tensors = {}
    for name in tqdm(list(source.keys()), desc=f"dequantizing {info.path.name}", unit="tensor"):
        with source.view(name, ()) as values:
            tensors[name] = values.to(getattr(torch, dtype)).contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
