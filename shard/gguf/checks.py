"""What a GGUF file is, checked before anything loads it (torch-free: the launcher runs this
before spawning shards, so an unsupported file is one line naming the problem, not a dead
shard)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# general.architecture -> the HF class our model registry serves it as. Mistral GGUFs say
# "llama" (llama.cpp converts them as such), and serve as Llama.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
}


class GgufError(ValueError):
    """The file is not a GGUF we can serve; the message names why."""


@dataclass(frozen=True)
class GgufInfo:
    path: Path
    architecture: str  # general.architecture, e.g. "llama"
    hf_architecture: str  # e.g. "LlamaForCausalLM"
    tensor_types: frozenset[str]  # GGML types of the tensors, e.g. {"F32", "Q4_1"}
    head_dim: int | None = None  # {arch}.attention.key_length, when the file gives it

    @property
    def float_dtype(self) -> str:
        """The dtype `--dtype auto` serves it in: the file's own float type when all of it is
        one (an F32 file stays exact), else bfloat16 (dequantized values, as in the demo)."""
        weights = self.tensor_types - {"F32"}  # norms are F32 in every GGUF
        if not weights:
            return "float32"
        return "float16" if weights == {"F16"} else "bfloat16"


def find_gguf(path: Path) -> Path | None:
    """`path` itself when it is a .gguf file; the one .gguf of a directory without config.json;
    None when it is not a GGUF model. Several .gguf files in one directory is an error."""
    if path.is_file() and path.suffix == ".gguf":
        return path
    if not path.is_dir() or (path / "config.json").exists():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        names = ", ".join(f.name for f in found)
        raise GgufError(f"{path} holds several GGUF files ({names}); pass one of them")
    return found[0] if found else None


def inspect_gguf(path: Path) -> GgufInfo:
    """Reads the header (metadata and tensor table; no weights) and refuses what we cannot
    serve: an architecture our models lack, a quantization type the gguf library cannot
    dequantize."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the library raises bare ValueErrors and struct errors
        raise GgufError(f"{path} is not a readable GGUF file ({exc})") from exc
    field = reader.get_field("general.architecture")
    architecture = field.contents() if field is not None else "(none)"
    if architecture not in ARCHITECTURES:
        raise GgufError(
            f"{path.name}: GGUF architecture {architecture!r} is not supported; "
            f"supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    types = {t.tensor_type for t in reader.tensors}
    bad = sorted(t.name for t in types if not _can_dequantize(t))
    if bad:
        raise GgufError(
            f"{path.name}: GGUF tensor type(s) {', '.join(bad)} cannot be dequantized by the "
            "installed gguf library"
        )
    names = frozenset(t.name for t in types)
    key_length = reader.get_field(f"{architecture}.attention.key_length")
    head_dim = int(key_length.contents()) if key_length is not None else None
    hf_architecture = ARCHITECTURES[architecture]
    experts = reader.get_field(f"{architecture}.expert_count")
    if architecture == "llama" and experts is not None and int(experts.contents()) > 0:
        hf_architecture = "MixtralForCausalLM"  # llama.cpp writes Mixtral as llama with experts
    return GgufInfo(path, architecture, hf_architecture, names, head_dim)


def _can_dequantize(qtype) -> bool:  # noqa: ANN001 (gguf's enum; gguf is imported lazily)
    """Dequantizes one block of zeros: the library's public API says best what it supports."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    _, block_bytes = GGML_QUANT_SIZES[qtype]
    try:
        dequantize(np.zeros((1, block_bytes), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True
