"""The launcher's contract with each shard process, read from its environment in one place.
Torch-free, so the entry point can read its rank before the heavy imports."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DistributedEnv:
    """The launcher's contract: RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    @classmethod
    def from_env(cls) -> DistributedEnv:
        env = os.environ
        return cls(
            rank=int(env.get("RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", "29500")),
        )
