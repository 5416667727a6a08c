"""Probe: collective tests with torch.distributed (all-to-all in a machine, all-gather across).

``op: alltoall`` starts one worker per configured GPU of this machine (NCCL when CUDA
is available, else gloo with one CPU process per GPU), exchanges a known pattern,
verifies every received element exactly and measures bus bandwidth. Rank 0 opens
the TCPStore on port 0 and reports the port, so concurrent tests never race for one.
``op: allgather`` runs this machine's rank of a multi-machine all-gather (rendezvous
at ``master_addr:master_port``, a node of the group). ``op: free_port`` picks a port
for such a group on the master. A worker that outlives ``timeout`` is killed and the
test reports a hang. Node-side: standard library here, torch only inside workers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

from brctl.diagnostics.protocol import serve

_GRACE = 5.0  # seconds after the test timeout for workers to report before being killed


def _root() -> str:
    """Where the ``brctl`` package lives (a directory or the cached zip)."""
    import brctl

    return os.path.dirname(os.path.dirname(os.path.abspath(brctl.__file__)))


def _worker_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    # Keep the node's own PYTHONPATH (site customisation, a conda env) after brctl's root.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_root(), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")  # one CPU process per "GPU": no oversubscription
    env.update(extra)
    return env


def _spawn(config: dict[str, Any], env: dict[str, str], port_later: bool = False
           ) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "brctl.diagnostics.collective", "--worker", json.dumps(config)],
        stdin=subprocess.PIPE if port_later else subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env=env,
    )


def _reap(procs: list[subprocess.Popen[str]], deadline: float) -> tuple[list[dict[str, Any]], bool]:
    """Each worker's JSON line; kills all when ``deadline`` passes (then hung=True)."""
    reports: list[dict[str, Any]] = []
    hung = False
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True
            for p in procs:
                if p.poll() is None:
                    p.kill()
            out, err = proc.communicate()
        reports.append(_report(rank, proc.returncode, out, err))
    return reports, hung


def _report(rank: int, code: int | None, out: str, err: str) -> dict[str, Any]:
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            try:
                doc: dict[str, Any] = json.loads(line)
                return doc
            except ValueError:
                break
    tail = (err.strip().splitlines() or ["no output"])[-1][:300]
    return {"rank": rank, "ok": False, "finished": False, "exit_code": code, "error": tail}


def _summary(op: str, reports: list[dict[str, Any]], hung: bool, timeout: float,
             start: float) -> dict[str, Any]:
    if any(r.get("skip") for r in reports):
        return {"op": op, "skipped": next(r["skip"] for r in reports if r.get("skip"))}
    finished = [r for r in reports if r.get("finished")]
    bad_data = [r for r in finished if not r.get("data_ok")]
    errors = [r for r in reports if not r.get("finished")]
    status = "pass"
    if hung:
        status = "hang"
    elif errors:
        status = "error"
    elif bad_data:
        status = "wrong_data"
    busbw = [r["busbw_gbps"] for r in finished if r.get("busbw_gbps") is not None]
    return {
        "op": op,
        "status": status,
        "backend": next((r.get("backend") for r in reports if r.get("backend")), None),
        "world": len(reports),
        "timeout": timeout,
        "hung_ranks": [r.get("rank") for r in errors] if hung else [],
        "errors": [f"rank {r.get('rank')}: {r.get('error')}" for r in errors][:8],
        "mismatches": [f"rank {r.get('rank')}: {r.get('mismatch')}" for r in bad_data][:8],
        "busbw_gbps": min(busbw) if busbw else None,  # the slowest rank bounds the machine
        "seconds": time.monotonic() - start,
    }


def alltoall(request: dict[str, Any]) -> dict[str, Any]:
    """All-to-all across ``world`` local workers (one per GPU)."""
    if importlib.util.find_spec("torch") is None:
        return {"op": "alltoall", "skipped": "torch is not installed on this machine"}
    world = int(request["world"])
    timeout = float(request["timeout"])
    start = time.monotonic()
    base = {"op": "alltoall", "world": world, "bytes": int(request.get("bytes", 1 << 20)),
            "iterations": int(request.get("iterations", 5)), "timeout": timeout,
            "master_addr": "127.0.0.1", "master_port": 0}
    env = _worker_env({"GLOO_SOCKET_IFNAME": "lo"})  # machine-local: loopback only
    # Every worker starts at once (importing torch takes seconds); rank 0 reports the
    # port of its store and the others read it on stdin.
    first = _spawn({**base, "rank": 0, "local_rank": 0}, env)
    rest = [_spawn({**base, "rank": r, "local_rank": r}, env, port_later=True)
            for r in range(1, world)]
    port = _read_port(first, start + timeout)
    for proc in rest:
        assert proc.stdin is not None
        try:
            proc.stdin.write(f"port {port or 0}\n")
            proc.stdin.flush()  # communicate() closes it later
        except OSError:
            pass  # it died already; _reap reports why
    reports, hung = _reap([first, *rest], start + timeout + _GRACE)
    return _summary("alltoall", reports, hung, timeout, start)


def _read_port(proc: subprocess.Popen[str], deadline: float) -> int | None:
    """Rank 0 prints ``port N`` once its store listens (or exits on failure)."""
    import selectors

    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while time.monotonic() < deadline:
        if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
            break
        line = proc.stdout.readline()
        if not line:
            return None
        if line.startswith("port "):
            return int(line.split()[1])
    return None


def allgather(request: dict[str, Any]) -> dict[str, Any]:
    """This machine's rank of an all-gather across ``nnodes`` machines."""
    if importlib.util.find_spec("torch") is None:
        return {"op": "allgather", "skipped": "torch is not installed on this machine"}
    timeout = float(request["timeout"])
    start = time.monotonic()
    config = {"op": "allgather", "world": int(request["nnodes"]), "rank": int(request["node_rank"]),
              "local_rank": 0, "bytes": int(request.get("bytes", 1 << 20)),
              "iterations": int(request.get("iterations", 5)), "timeout": timeout,
              "master_addr": request["master_addr"], "master_port": int(request["master_port"])}
    extra = {"GLOO_SOCKET_IFNAME": request["gloo_ifname"]} if request.get("gloo_ifname") else {}
    proc = _spawn(config, _worker_env(extra))
    reports, hung = _reap([proc], start + timeout + _GRACE)
    return _summary("allgather", reports, hung, timeout, start)


def free_port(request: dict[str, Any]) -> dict[str, Any]:
    """A free TCP port on ``address`` for a group's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((request.get("address", "0.0.0.0"), 0))
        return {"op": "free_port", "port": sock.getsockname()[1]}


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """Dispatch on ``op``."""
    ops = {"alltoall": alltoall, "allgather": allgather, "free_port": free_port}
    op = request.get("op")
    if op not in ops:
        raise ValueError(f"unknown op {op!r}; expected one of {', '.join(ops)}")
    return ops[op](request)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        from brctl.diagnostics.collective_worker import main

        main(json.loads(sys.argv[2]))
    else:
        serve(handle)
