"""A small training loop for scripts/gpu-check's stacks stage: one rank, one of them hangs.

Started by ``scripts/gpu_check.py`` once per rank with RANK, LOCAL_RANK and WORLD_SIZE in
its environment (as torchrun sets them, which is how ``brctl stacks`` finds ranks). Every
rank trains a stack of linear layers on its device; the rank named by ``--hang-rank``
blocks inside its data loader (``Shards.__getitem__`` → ``wait_for_shard``) at
``--hang-step``, as a rank waiting for a shard from a dead storage server would. Each
rank touches ``--ready DIR/rank-N`` once it is where the check wants to see it (healthy:
a few steps done; hung: inside the hang). ``--tag`` only makes the command line unique,
so concurrent checks never see each other's ranks.

On CUDA a step is ~0.1 s of matrix work then ``torch.cuda.synchronize()``, so a healthy
rank is nearly always seen waiting there; on the CPU stand-in (tests) a short sleep
plays the device's part.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch


class Shards(torch.utils.data.Dataset[Any]):
    """One item per step: a cheap seed; the batch itself is built on the device."""

    def __init__(self, hang_at: int | None, ready: Path) -> None:
        self.hang_at, self.ready = hang_at, ready

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        if self.hang_at is not None and index >= self.hang_at:
            wait_for_shard(index, self.ready)
        return torch.tensor(index)


def wait_for_shard(index: int, ready: Path) -> None:
    """The hang: a shard that never arrives."""
    ready.touch()
    while True:
        time.sleep(1.0)


def train_step(layers: list[Any], opt: Any, x: Any, device: Any) -> None:
    """Forward, backward, update; then wait for the device (a sleep on the CPU stand-in)."""
    h = x
    for w in layers:
        h = torch.tanh(h @ w)
    loss = h.square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    else:
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--hang-rank", type=int, required=True)
    parser.add_argument("--hang-step", type=int, default=3)
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    torch.manual_seed(rank)
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % args.gpus)
        torch.cuda.set_device(device)
        dim, batch, depth = 8192, 2048, 8  # ~7 TFLOP a step: the GPU, not Python, takes the time
    else:
        device, dim, batch, depth = torch.device("cpu"), 64, 16, 2
        # one thread: three ranks' OpenMP pools spinning on 2 shared cores once made a
        # healthy rank's matmul last long enough to be where py-spy caught it, unlike its
        # peer's sleep, so no two ranks agreed and the hung one was no outlier
        torch.set_num_threads(1)
    layers = [(torch.randn(dim, dim, device=device) / dim ** 0.5).requires_grad_()
              for _ in range(depth)]
    opt = torch.optim.SGD(layers, lr=1e-3)
    x = torch.randn(batch, dim, device=device)
    ready = args.ready / f"rank-{rank}"
    hang_at = args.hang_step if rank == args.hang_rank else None
    loader = torch.utils.data.DataLoader(Shards(hang_at, ready), batch_size=None)
    for step, seed in enumerate(loader):
        train_step(layers, opt, x * (1.0 + 1e-3 * float(seed)), device)
        if step == args.hang_step:
            ready.touch()


if __name__ == "__main__":
    main()
