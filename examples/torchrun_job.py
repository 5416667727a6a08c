#!/usr/bin/env python3
"""A plain torchrun job opted in to ``brctl stacks``'s flight-recorder reading.

Launch (each rank serves /tmp/brctl-job-<uid>/rank-<RANK>.sock while it runs)::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint head:29500 examples/torchrun_job.py

The opt-in is the two ``brctl.job`` lines; nothing else of brctl is needed in the
training image (``pip install --no-deps brctl``, or brctl's checkout on
``PYTHONPATH``). ``brctl stacks`` then reads every rank's recorder and group table,
with or without ptrace.
"""

import os

import torch
import torch.distributed as dist

import brctl.job

brctl.job.serve()  # before init_process_group is fine: the table is read when asked


def main() -> None:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else None
    if device is not None:
        torch.cuda.set_device(device)
    model = torch.nn.Linear(1024, 1024, device=device)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(1, 1001):
        x = torch.randn(32, 1024, device=device)
        loss = ddp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        brctl.job.report_step(step)  # optional: the last completed step, in the evidence
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
