#!/usr/bin/env python3
"""A Megatron-style job (tensor, pipeline and data-parallel groups) under ``brctl.job``.

Here the training script is untouched: brctl's launcher wraps it, so the opt-in
lives in the launch line (the same for Megatron-LM's ``pretrain_gpt.py``)::

    torchrun --nnodes 4 --nproc-per-node 8 ... \\
        -m brctl.job -- examples/megatron_style_job.py --tp 2 --pp 2

``python -m brctl.job -- SCRIPT ARGS`` (or ``-m MODULE ARGS``) starts the rank's
socket, runs the script as ``__main__`` and removes the socket when it ends.

Name the groups as Megatron does (``group_desc=``): gloo's flight recorder has no
group table, and brctl's answer lists each group's name, description and global
ranks; the descriptions (``TENSOR_MODEL_PARALLEL_GROUP``, ``DATA_PARALLEL_GROUP``,
``PIPELINE_MODEL_PARALLEL_GROUP``) tell brctl which kind of group a stuck
collective belongs to. Every rank creates every group, in one order, as
``new_group`` requires: the names are then job-wide. Ranks follow Megatron's order
(``rank = t + TP * (d + DP * stage)``).
"""

import argparse
import os

import torch
import torch.distributed as dist


def groups(tp: int, pp: int) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    dp = world // (tp * pp)
    t, d, stage = rank % tp, (rank // tp) % dp, rank // (tp * dp)

    def at(t_: int, d_: int, s_: int) -> int:
        return t_ + tp * (d_ + dp * s_)

    mine = {}
    for s_ in range(pp):
        for d_ in range(dp):
            g = dist.new_group([at(x, d_, s_) for x in range(tp)],
                               group_desc="TENSOR_MODEL_PARALLEL_GROUP")
            if (d_, s_) == (d, stage):
                mine["tp"] = g
    for s_ in range(pp):
        for t_ in range(tp):
            g = dist.new_group([at(t_, x, s_) for x in range(dp)],
                               group_desc="DATA_PARALLEL_GROUP")
            if (t_, s_) == (t, stage):
                mine["dp"] = g
    for d_ in range(dp):
        for t_ in range(tp):
            g = dist.new_group([at(t_, d_, x) for x in range(pp)],
                               group_desc="PIPELINE_MODEL_PARALLEL_GROUP")
            if (t_, d_) == (t, d):
                mine["pp"] = g
    mine.update(stage=stage, prev=at(t, d, stage - 1) if stage else None,
                next=at(t, d, stage + 1) if stage + 1 < pp else None)
    return mine


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--tp", type=int, default=2)
    args.add_argument("--pp", type=int, default=2)
    opts = args.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    g = groups(opts.tp, opts.pp)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for _step in range(1000):
        x = torch.randn(8, 256, device=device)
        if g["prev"] is not None:
            dist.recv(x, src=g["prev"])
        dist.all_reduce(x, group=g["tp"])  # the tensor-parallel reduction of a layer
        if g["next"] is not None:
            dist.send(x, dst=g["next"])
        dist.all_reduce(x.mean(0), group=g["dp"])  # the gradient all-reduce
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
