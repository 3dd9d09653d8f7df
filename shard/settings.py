"""The shard's configuration, parsed once from its command line and environment."""

import os
from dataclasses import dataclass

import torch

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


@dataclass(frozen=True)
class RankEnv:
    """The torch.distributed environment the launcher sets for each shard."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_environ(cls) -> "RankEnv":
        return cls(
            rank=int(os.environ.get("RANK", "0")),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        )
