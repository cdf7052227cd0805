"""The trainer's place among its peers: process group, rank and world size, its device, DDP wrapping
and the collectives the loop needs.

Under torchrun (WORLD_SIZE > 1) each process is one rank, with DDP over NCCL (CUDA) or gloo (CPU).
A single process may instead serve the data path of W simulated ranks (`data_ranks`): the global
batch is assembled from their slices, the same model maths as W=1, used to test that resuming with
another world size still delivers every entry exactly once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Distributed:
    rank: int
    world: int
    device: torch.device

    @classmethod
    def setup(cls, device: str, cpu_threads: int | None) -> "Distributed":
        """Join the process group when torchrun started this process, and pick the device:
        training.device `cuda`, or `auto` with CUDA present, is this rank's GPU (LOCAL_RANK)."""
        rank, world = 0, 1
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            if not dist.is_initialized():
                dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
            if torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            rank, world = dist.get_rank(), dist.get_world_size()
        use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        if not use_cuda and cpu_threads is not None:
            torch.set_num_threads(cpu_threads)
        return cls(rank, world, torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if use_cuda else "cpu"))

    def data_ranks(self, simulate_world_size: int) -> tuple[list[int], int]:
        """The ranks whose rows this process reads, and the data-parallel world size: this rank of
        the real world, or all W ranks of a simulated one."""
        if self.world > 1 and simulate_world_size != 1:
            raise ValueError("simulate_world_size is for single-process runs; under torchrun the world size is real")
        if self.world == 1:
            return list(range(simulate_world_size)), max(self.world, simulate_world_size)
        return [self.rank], self.world

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` under DDP when there are peers, else itself."""
        if self.world == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over the ranks, in place."""
        if self.world > 1:
            dist.all_reduce(t)
        return t

    def any_rank(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank; every rank gets the same answer."""
        if self.world == 1:
            return flag
        t = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def close(self) -> None:
        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()
