"""A real gloo training job with tensor, data and pipeline groups, opted in to brctl.job.

``start_trainjob`` runs it (``script=FR_SCRIPT``); ``start_frjob`` adds what the
flight-recorder tests need: the layout (``FRJOB_TP``, Megatron's order
``rank = t + TP·(d + DP·stage)``), the opt-in (each rank calls ``brctl.job.serve()``
unless ``FRJOB_OPT_IN=0``), and the job as an unprivileged uid (``uid``: started
under ``setpriv``, with the system interpreter and torch from ``PYTHONPATH``, since
that uid cannot reach the venv's interpreter).

Each step: a later stage ``recv``s activations from the stage before (p2p: gloo
does not record it), the rank joins its ``TENSOR_MODEL_PARALLEL_GROUP``
all_reduce, sends to the next stage, joins its ``DATA_PARALLEL_GROUP`` all_reduce,
then the world's loss all_reduce; ``brctl.job.report_step(step)``; the log line
``step N loss X`` as in ``trainjob``. Faults (test inputs, read only here):
``FRJOB_SKIP_RANK=R`` skips its data-parallel all_reduce at ``FRJOB_FAULT_STEP``
(default 4) and logs ``skipped dp all_reduce`` first; ``FRJOB_GIL_RANK=R`` holds
the GIL in native code (``ctypes.PyDLL`` ``sleep``) from that step, once the file
``FRJOB_GIL_FILE`` exists when that is set (the test says when);
``FRJOB_SLOW_FILE``: while that file holds ``RANK SECONDS``, that rank spends
SECONDS more per step in ``slow_compute`` before its first collective.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from tests.kits.cluster import SshCluster
from tests.kits.trainjob import TrainJob, start_trainjob

REPO = Path(__file__).resolve().parents[2]
SITE = next(p for p in sys.path if p.endswith("site-packages") and "torch" in os.listdir(p))

FR_SCRIPT = r'''
"""brctl's flight-recorder test job (see tests/kits/frjob.py)."""
import os, subprocess, sys, time


def launch(args):
    nproc, base, world = int(args[0]), int(args[1]), int(args[2])
    procs = []
    for local in range(nproc):
        env = dict(os.environ, RANK=str(base + local), LOCAL_RANK=str(local),
                   WORLD_SIZE=str(world))
        procs.append(subprocess.Popen([sys.executable, __file__, "rank", *args[3:]], env=env))
    for p in procs:
        p.wait()


def stuck_in_data_loader():
    while True:
        time.sleep(3600)


def hold_gil_in_native_code(seconds):
    import ctypes
    ctypes.PyDLL(None).sleep(int(seconds))  # PyDLL: the GIL stays held


def slow_now(path):
    """(rank, seconds) from the test's file "RANK SECONDS", or None."""
    try:
        with open(path) as fh:
            rank, seconds = fh.read().split()
        return int(rank), float(seconds)
    except (OSError, TypeError, ValueError):
        return None


def slow_compute(seconds):
    time.sleep(seconds)


def collective(dist, t, group):
    dist.all_reduce(t, group=group)
    return t


def train(args):
    import datetime
    import torch
    import torch.distributed as dist

    if os.environ.get("FRJOB_OPT_IN", "1") == "1":
        import brctl.job
        brctl.job.serve()
        step_done = brctl.job.report_step
    else:
        step_done = lambda step: None
    pp, step_seconds, logdir = int(args[0]), float(args[1]), args[4]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    tp = int(os.environ.get("FRJOB_TP", "1"))
    dp = world // (tp * pp)
    t, d, stage = rank % tp, (rank // tp) % dp, rank // (tp * dp)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=30))
    at = lambda t_, d_, s_: t_ + tp * (d_ + dp * s_)
    mine = {}
    for s_ in range(pp):  # every rank creates every group, in one order (names are job-wide)
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
            dist.new_group([at(t_, d_, x) for x in range(pp)],
                           group_desc="PIPELINE_MODEL_PARALLEL_GROUP")
    fault = int(os.environ.get("FRJOB_FAULT_STEP", "4"))
    skip = os.environ.get("FRJOB_SKIP_RANK") == str(rank)
    gil = os.environ.get("FRJOB_GIL_RANK") == str(rank)
    log = open(os.path.join(logdir, "rank%d.log" % rank), "a", buffering=1)
    step = 0
    while True:
        step += 1
        if stage > 0:
            x = torch.zeros(4, 16)
            dist.recv(x, src=rank - tp * dp)
        else:
            x = torch.randn(4, 16)
        if gil and step >= fault and os.path.exists(os.environ.get("FRJOB_GIL_FILE", "/")):
            log.write("holding the GIL\n")
            hold_gil_in_native_code(3600)
        slow = slow_now(os.environ.get("FRJOB_SLOW_FILE"))
        if slow and slow[0] == rank:
            slow_compute(slow[1])
        y = collective(dist, torch.tanh(x + step), mine["tp"])
        if stage + 1 < pp:
            dist.send(y.contiguous(), dst=rank + tp * dp)
        if skip and step == fault:
            log.write("skipped dp all_reduce\n")
        else:
            collective(dist, y.mean(0), mine["dp"])
        loss = collective(dist, (y * y).mean().reshape(1), None)
        step_done(step)
        log.write("step %d loss %.6f\n" % (step, float(loss[0])))
        time.sleep(step_seconds)


if __name__ == "__main__":
    if sys.argv[1] == "launch":
        launch(sys.argv[2:])
    else:
        train(sys.argv[2:])
'''


@contextmanager
def start_frjob(cluster: SshCluster, *, tp: int, pp: int, nproc: int,
                uid: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
                step_seconds: float = 0.1, nodes: Optional[Sequence[str]] = None
                ) -> Iterator[TrainJob]:
    """The job on ``nodes`` (default: all the cluster's machines; ``uid``: as that user);
    stopped after."""
    top = Path(tempfile.mkdtemp(prefix="brctl-frjob-"))
    top.chmod(0o755)
    (top / "logs").mkdir()
    if uid is not None:
        os.chown(top / "logs", uid, uid)
    variables = {"FRJOB_TP": str(tp), "PYTHONPATH": f"{SITE}:{REPO}", **(env or {})}
    if uid is None:  # root's default /tmp/brctl-job-0 is shared with every other root job here
        variables.setdefault("BRCTL_JOB_SOCKET_DIR", str(top / "sockets"))
    wrap = (["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
            if uid is not None else [])
    python = "/usr/bin/python3" if uid is not None else sys.executable
    job = start_trainjob(cluster, top, nodes=nodes, nproc=nproc, pp=pp, step_seconds=step_seconds,
                         env=variables, python=python, script=FR_SCRIPT, wrap=wrap)
    try:
        yield job
    finally:
        job.stop()
        shutil.rmtree(top, ignore_errors=True)
