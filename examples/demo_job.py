#!/usr/bin/env python3
"""A tiny stand-in training job for brctl's local demo (``scripts/demo``); standard library only.

It behaves like a data-parallel job where it matters to brctl: one process per
rank (``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` in its environment, ``brctl-demo-train``
on its command line), a step barrier between all ranks (a stuck rank stalls
everyone, the others wait in ``all_reduce``), ``step N loss X`` lines in a log,
a checkpoint every few steps, and training code loaded from the machine's
``update.root``/current release (so ``brctl update`` and its rollback matter).

Subcommands (all state lives under ``/tmp/brctl-demo``, the paths of examples/demo.yaml):

    demo_job.py launch --nodes local1,local2,...   # job.restart_command: (re)start all ranks
    demo_job.py stop                               # job.stop_command
    demo_job.py drain --node N --reason TEXT       # job.evict_command: the "scheduler" log
    demo_job.py inject hang NODE                   # the demo's fault: NODE's ranks block
    demo_job.py train ...                          # one rank (started by launch)

Faults are the demo's test inputs (a file the rank reads, a bad release, a fake
NVML reading): brctl itself has no fault switch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BASE = Path(os.environ.get("BRCTL_DEMO_DIR", "/tmp/brctl-demo"))
JOB = BASE / "job"
TAG = "brctl-demo-train"
GPUS = 2  # ranks per machine, as in examples/local.yaml
STEP_SECONDS = 0.25
CKPT_EVERY = 5


def _pids() -> list[int]:
    try:
        return [int(p) for p in (JOB / "pids").read_text().split()]
    except (OSError, ValueError):
        return []


def stop() -> None:
    """Kill every rank of the current run (SIGCONT first: a stopped rank ignores SIGTERM)."""
    for pid in _pids():
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
    (JOB / "pids").write_text("")


def launch(nodes: list[str]) -> None:
    """Start WORLD_SIZE ranks, GPUS per machine, in machine order; return at once."""
    JOB.mkdir(parents=True, exist_ok=True)
    stop()
    run_id = str(time.time_ns())
    world = GPUS * len(nodes)
    pids = []
    for rank in range(world):
        node = nodes[rank // GPUS]
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank % GPUS),
                   WORLD_SIZE=str(world), DEMO_NODE=node)
        err = open(JOB / f"rank{rank}.err", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen([sys.executable, __file__, "train", TAG, "--run", run_id],
                                env=env, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
        pids.append(proc.pid)
    (JOB / "pids").write_text(" ".join(map(str, pids)))
    with (JOB / "launches.log").open("a") as fh:
        fh.write(f"{time.time():.3f} {','.join(nodes)}\n")


def _model(node: str) -> dict[str, object]:
    """The training code of this machine's current release (``update.root``/current/model.py)."""
    path = BASE / node / "train" / "current" / "model.py"
    code: dict[str, object] = {}
    if path.exists():
        exec(compile(path.read_text(), str(path), "exec"), code)  # the job's own code
    return code


def _resume() -> int:
    try:
        return int((JOB / "ckpt" / "latest").read_text())
    except (OSError, ValueError):
        return 0


def stuck_in_data_loader() -> None:
    """Where an injected hang blocks (the stack brctl stacks will single out)."""
    while True:
        time.sleep(1)


def all_reduce(barrier: Path, step: int, rank: int, world: int) -> None:
    """Wait until every rank reached ``step`` (files in a shared directory)."""
    (barrier / f"{step}.{rank}").touch()
    while len(list(barrier.glob(f"{step}.*"))) < world:
        time.sleep(0.02)


def train(run_id: str) -> None:
    """One rank: step, barrier, log, checkpoint, forever."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    node = os.environ["DEMO_NODE"]
    barrier = JOB / "barrier" / run_id
    barrier.mkdir(parents=True, exist_ok=True)
    model = _model(node)
    step = _resume()
    while True:
        step += 1
        if (JOB / f"hang-{node}").exists():  # the fault follows the machine, not the rank
            stuck_in_data_loader()
        loss = model["step"](step) if "step" in model else 10.0 / step  # type: ignore[operator]
        time.sleep(STEP_SECONDS)
        all_reduce(barrier, step, rank, world)
        if rank == 0:
            with (JOB / "train.log").open("a") as fh:
                fh.write(f"{time.time():.3f} step {step} loss {loss:.4f}\n")
            if step % CKPT_EVERY == 0:
                (JOB / "ckpt").mkdir(exist_ok=True)
                (JOB / "ckpt" / "latest").write_text(str(step))
        if step % CKPT_EVERY == 0:  # this machine's shards: ckpt.dir/step_N/rankR.json
            shard = BASE / node / "ckpt" / f"step_{step}"
            shard.mkdir(parents=True, exist_ok=True)
            (shard / f"rank{rank}.json").write_text(json.dumps({"step": step, "rank": rank}))


def main() -> None:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("launch").add_argument("--nodes", required=True)
    sub.add_parser("stop")
    drain = sub.add_parser("drain")
    drain.add_argument("--node", required=True)
    drain.add_argument("--reason", required=True)
    inject = sub.add_parser("inject")
    inject.add_argument("what", choices=["hang"])
    inject.add_argument("node")
    tr = sub.add_parser("train")
    tr.add_argument("tag")
    tr.add_argument("--run", required=True)
    args = ap.parse_args()
    if args.cmd == "launch":
        launch(args.nodes.split(","))
    elif args.cmd == "stop":
        stop()
    elif args.cmd == "drain":
        JOB.mkdir(parents=True, exist_ok=True)
        with (JOB / "scheduler.log").open("a") as fh:
            fh.write(f"drain {args.node}: {args.reason}\n")
    elif args.cmd == "inject":
        (JOB / f"hang-{args.node}").touch()
    else:
        train(args.run)


if __name__ == "__main__":
    main()
