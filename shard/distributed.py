"""The process group a shard computes in: rank, world size and the three collectives we use.

Every collective is a no-op at world size 1, so a single shard never touches torch.distributed
(no rendezvous, no free port needed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as tdist

from shard.platforms import platform_of
from shard.rank_env import DistributedEnv

# gloo cannot reduce these dtypes on every torch build; we reduce them in float32 instead.
_GLOO_UPCAST = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def _uses_gloo(self) -> bool:
        return tdist.get_backend() == "gloo"

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sums `t` over ranks in place and returns it."""
        if self.world_size == 1:
            return t
        if t.dtype in _GLOO_UPCAST and self._uses_gloo:
            wide = t.float()
            tdist.all_reduce(wide)
            t.copy_(wide)
        else:
            tdist.all_reduce(t)
        return t

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenates every rank's `t` (same shape on all ranks) along `dim`, rank order."""
        if self.world_size == 1:
            return t
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        tdist.all_gather(parts, t)
        return torch.cat(parts, dim=dim)

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrites `t` in place with rank `src`'s copy and returns it."""
        if self.world_size == 1:
            return t
        tdist.broadcast(t, src=src)
        return t


def init_distributed(device: torch.device) -> Distributed:
    """Joins the process group described by the environment (NCCL on CUDA, gloo otherwise).

    A CUDA `device` without an index resolves to `cuda:LOCAL_RANK`, one GPU per shard.
    """
    env = DistributedEnv.from_env()
    if not 0 <= env.rank < env.world_size:
        raise ValueError(f"RANK={env.rank} is outside WORLD_SIZE={env.world_size}")
    platform = platform_of(torch.device(device))
    device = platform.bind(torch.device(device), env.local_rank)
    if env.world_size > 1 and not tdist.is_initialized():
        tdist.init_process_group(
            backend=platform.dist_backend,
            init_method=f"tcp://{env.master_addr}:{env.master_port}",
            rank=env.rank,
            world_size=env.world_size,
            device_id=device if platform.dist_backend == "nccl" else None,
        )
    return Distributed(
        rank=env.rank, world_size=env.world_size, local_rank=env.local_rank, device=device
    )
