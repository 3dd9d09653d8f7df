"""The shard's configuration, parsed once from its command line and environment."""

from dataclasses import dataclass

import torch

OVERLAP_CHOICES = ("auto", "on", "off")  # --overlap-schedule
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ShardSettings:
    model_id: str
    uds_path: str
    dtype: str = "auto"
    # None: the checkpoint's quantization_config decides; else it must name the same method.
    quantize: str | None = None
    # None: the default backend for the device.
    attention: str | None = None
    block_size: int = 16
    cuda_memory_fraction: float = 0.9
    cpu_kv_cache_gb: float | None = None
    # Multi-LoRA: adapter name -> PEFT directory; slots, host cache and rank limits.
    lora_adapters: tuple[tuple[str, str], ...] = ()
    # LoRA state (slots in every layer) even without startup adapters, for runtime loading.
    enable_lora: bool = False
    max_loras: int = 4
    max_cpu_loras: int | None = None
    max_lora_rank: int = 64
    # torch.compile the forward pass (shard/platforms/cpu/compiled.py): CPU, one shard, dense
    # weights, no LoRA.
    compile: bool = False
    # Mixture-of-Experts: this rank holds E/world_size whole experts (--expert-parallel) instead
    # of a 1/world_size slice of every expert's intermediate dimension.
    expert_parallel: bool = False
    # CUDA graphs' batch-size buckets for decode: None, the default on a GPU (none on a CPU);
    # () none (--cuda-graphs 0).
    cuda_graphs: tuple[int, ...] | None = None
    # Queue each decode step's successor before the router asks for it (shard/steps_ahead.py):
    # "auto" where the device computes apart from the host (CUDA), "on", "off".
    overlap_schedule: str = "auto"
    # Speculative decoding with a draft model (shard/draft.py): its directory, loaded beside the
    # model with the same shards, attention and (for --dtype auto, its own checkpoint's) dtype.
    draft_model: str | None = None
