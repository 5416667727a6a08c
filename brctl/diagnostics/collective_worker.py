"""One rank of a collective test (runs in a worker process started by ``collective``).

Imports torch, joins the rendezvous (a TCPStore barrier bounded by
``startup_timeout``), creates the process group and prints ``ready``; then runs the
test, whose ``timeout`` the probe counts from that line.
Prints one JSON line: ``finished``, ``data_ok`` (every element exactly as sent),
``mismatch`` (the first wrong element), ``busbw_gbps`` (nccl-tests' bus bandwidth),
``backend``; or ``error``/``skip``. torch is imported here only.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from typing import Any


def _emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def _device(torch: Any, local_rank: int) -> tuple[str, Any]:
    """NCCL on this rank's GPU when CUDA is available, else gloo on the CPU."""
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise RuntimeError(f"rank {local_rank} needs GPU {local_rank} but CUDA sees {count}")
        torch.cuda.set_device(local_rank)
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _alltoall(torch: Any, dist: Any, cfg: dict[str, Any], device: Any) -> dict[str, Any]:
    world, rank = cfg["world"], cfg["rank"]
    n = max(1, cfg["bytes"] // 4)  # int32 elements sent to each peer
    idx = torch.arange(n, dtype=torch.int32, device=device)
    # Element i of the chunk from src to dst is (src*world+dst)*n + i (mod 2^31): unique.
    send = torch.cat([((rank * world + d) * n + idx) % (2**31 - 1) for d in range(world)])
    want = torch.cat([((s * world + rank) * n + idx) % (2**31 - 1) for s in range(world)])
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)  # warm-up: connections, buffers
    _sync(torch, device)
    start = time.perf_counter()
    data_ok, mismatch = True, None
    for _ in range(cfg["iterations"]):
        recv.fill_(-1)
        dist.all_to_all_single(recv, send)
        _sync(torch, device)
        if data_ok and not torch.equal(recv, want):
            data_ok = False
            bad = int((recv != want).nonzero()[0].item())
            mismatch = f"element {bad} (from rank {bad // n}): got {int(recv[bad])}, want {int(want[bad])}"
    per_iter = (time.perf_counter() - start) / cfg["iterations"]
    size = send.numel() * 4
    algbw = size / per_iter / 1e9
    # nccl-tests: busbw = algbw * (n-1)/n for all-to-all; a world of 1 is a loopback copy.
    busbw = algbw * (world - 1) / world if world > 1 else algbw
    return {"data_ok": data_ok, "mismatch": mismatch, "busbw_gbps": busbw, "algbw_gbps": algbw}


def _allgather(torch: Any, dist: Any, cfg: dict[str, Any], device: Any) -> dict[str, Any]:
    world, rank = cfg["world"], cfg["rank"]
    n = max(1, cfg["bytes"] // 4)
    idx = torch.arange(n, dtype=torch.int32, device=device)
    mine = (rank * n + idx) % (2**31 - 1)
    out = [torch.empty_like(mine) for _ in range(world)]
    start = time.perf_counter()
    data_ok, mismatch = True, None
    for _ in range(cfg["iterations"]):
        for t in out:
            t.fill_(-1)
        dist.all_gather(out, mine)
        _sync(torch, device)
        for src, got in enumerate(out):
            want = (src * n + idx) % (2**31 - 1)
            if data_ok and not torch.equal(got, want):
                data_ok = False
                mismatch = f"chunk from rank {src} differs"
    per_iter = (time.perf_counter() - start) / cfg["iterations"]
    algbw = n * 4 * world / per_iter / 1e9
    busbw = algbw * (world - 1) / world if world > 1 else algbw
    return {"data_ok": data_ok, "mismatch": mismatch, "busbw_gbps": busbw, "algbw_gbps": algbw}


def _rendezvous(dist: Any, cfg: dict[str, Any]) -> Any:
    """Join the TCPStore and wait until every rank has (within ``startup_timeout``).

    A store-only barrier: it needs no collective of the backend under test, so a
    broken collective is seen by the test itself, after readiness, not here.
    """
    startup = datetime.timedelta(seconds=cfg.get("startup_timeout", 300.0))
    rank = cfg["rank"]
    if cfg["master_port"] == 0 and rank != 0:
        # The probe tells us the port rank 0's store got (0: it failed to start).
        cfg["master_port"] = int((sys.stdin.readline().split() or ["port", "0"])[-1])
        if not cfg["master_port"]:
            raise RuntimeError("rank 0 did not start its rendezvous store")
    store = dist.TCPStore(cfg["master_addr"], cfg["master_port"], cfg["world"],
                          is_master=rank == 0, timeout=startup, wait_for_workers=False)
    if cfg["master_port"] == 0 and rank == 0:
        print(f"port {store.port}", flush=True)  # tells the probe where the others meet
    store.set(f"brctl/joined/{rank}", "1")
    store.wait([f"brctl/joined/{r}" for r in range(cfg["world"])], startup)
    return store


def main(cfg: dict[str, Any]) -> None:
    """Run one rank; always print one JSON line."""
    rank = cfg["rank"]
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        _emit({"rank": rank, "skip": f"torch is not importable: {exc}"})
        return
    try:
        backend, device = _device(torch, cfg["local_rank"])
        store = _rendezvous(dist, cfg)
        dist.init_process_group(backend, store=store, rank=rank, world_size=cfg["world"],
                                timeout=datetime.timedelta(seconds=cfg["timeout"]))
        print("ready", flush=True)  # the probe's test clock starts now
        test = _alltoall if cfg["op"] == "alltoall" else _allgather
        result = test(torch, dist, cfg, device)
        dist.destroy_process_group()
    except Exception as exc:  # reported per rank, the probe decides
        _emit({"rank": rank, "finished": False, "error": f"{type(exc).__name__}: {exc}"[:500]})
        return
    _emit({"rank": rank, "finished": True, "backend": backend,
           "torch": torch.__version__, **result})
