"""Probe: collective tests with torch.distributed (all-to-all in a machine, all-gather across).

``op: alltoall`` starts one worker per configured GPU of this machine (NCCL when CUDA
is available, else gloo with one CPU process per GPU), exchanges a known pattern,
verifies every received element exactly and measures bus bandwidth. Rank 0 opens
the TCPStore on port 0 and reports the port, so concurrent tests never race for one.
``op: allgather`` runs this machine's rank of a multi-machine all-gather (rendezvous
at ``master_addr:master_port``, a node of the group). ``op: free_port`` picks a port
for such a group on the master. Workers print ``ready`` once torch is imported and
every rank has reached the rendezvous; ``timeout`` counts from then, so a slow
``import torch`` is never taken for a hang. A worker not ready within
``startup_timeout``, or still running ``timeout`` after readiness, is killed and the
test reports a hang (``phase`` says which). Node-side: standard library here, torch only inside workers.

Workers of a probe started by ``isolate.launch`` run as it does (``isolate.child_argv``):
the same interpreter, isolated (``-I``: no ``PYTHON*`` variable, user site or cwd), the
probe's import paths, its ``ImportGuard`` and its declared entries' ``sitecustomize``; a
worker's refusal (a module that fails the rule) is the probe's: the node is refused,
naming the file. Run by hand (no guard), workers get this process's ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from brctl.diagnostics import isolate
from brctl.diagnostics.protocol import serve

_GRACE = 5.0  # seconds after the test timeout for workers to report before being killed
_READY = "ready"  # a worker's line once torch is imported and every rank has joined


def _root() -> str:
    """Where the ``brctl`` package lives (a directory or the cached zip)."""
    import brctl

    return os.path.dirname(os.path.dirname(os.path.abspath(brctl.__file__)))


def _worker_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    # Run by hand: keep the node's own PYTHONPATH (site customisation, a conda env) after
    # brctl's root. An isolated worker (``-I``) ignores it: its paths are the probe's.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_root(), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")  # one CPU process per "GPU": no oversubscription
    env.update(extra)
    return env


def _worker_argv(config: dict[str, Any]) -> list[str]:
    args = ["--worker", json.dumps(config)]
    return (isolate.child_argv("brctl.diagnostics.collective", args)
            or [sys.executable, "-m", "brctl.diagnostics.collective", *args])


class _Worker:
    """One worker process and what it has said so far (stdout read raw, line by line).

    Raw ``os.read`` on the pipe, never a buffered reader: a buffered ``readline``
    could swallow the result line that follows ``port N`` in the same read (a
    one-process test finishes right after it), and the result was lost.
    """

    def __init__(self, rank: int, argv: list[str], env: dict[str, str],
                 port_later: bool) -> None:
        self.rank = rank
        # stderr goes to a file: a chatty torch must never block on a full pipe.
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 -- lives as long as the worker
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if port_later else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=self.stderr, env=env)
        self.buffer = b""
        self.lines: list[str] = []
        self.ready = False
        self.closed = False

    def feed(self, chunk: bytes) -> list[str]:
        """Add output; the complete lines it finished."""
        self.buffer += chunk
        *done, self.buffer = self.buffer.split(b"\n")
        lines = [ln.decode("utf-8", errors="replace") for ln in done]
        self.lines.extend(lines)
        return lines

    def tell_port(self, port: int) -> None:
        """Pass rank 0's store port on stdin (a dead worker is reported by ``report``)."""
        if self.proc.stdin is None:
            return
        try:
            self.proc.stdin.write(f"port {port}\n".encode())
            self.proc.stdin.close()
        except OSError:
            pass

    def refusal(self) -> str | None:
        """Why the worker refused to import a module (``isolate.refuse_now``), or ``None``."""
        if self.proc.returncode != isolate.REFUSED_EXIT:
            return None
        for line in self.lines:
            if line.startswith(isolate.REFUSED_MARK + " "):
                try:
                    why = json.loads(line[len(isolate.REFUSED_MARK) + 1:])
                except ValueError:
                    continue
                if isinstance(why, str):
                    return why
        return None

    def report(self) -> dict[str, Any]:
        """Its JSON result line, else an error built from the tail of stderr."""
        for line in reversed([*self.lines, self.buffer.decode("utf-8", errors="replace")]):
            if line.startswith("{"):
                try:
                    doc: dict[str, Any] = json.loads(line)
                    return doc
                except ValueError:
                    break
        self.stderr.seek(0)
        err = self.stderr.read()[-4000:].decode("utf-8", errors="replace")
        self.stderr.close()
        tail = (err.strip().splitlines() or ["no output"])[-1][:300]
        return {"rank": self.rank, "ok": False, "finished": False,
                "exit_code": self.proc.returncode, "error": tail}


def _supervise(workers: list[_Worker], startup_deadline: float, timeout: float
               ) -> tuple[str | None, float | None]:
    """Watch the workers until all exit; kill them all on a missed deadline.

    Two clocks: every worker must be ready (torch imported, all ranks at the
    rendezvous) by ``startup_deadline``; from the moment the last one is, the test
    has ``timeout`` (+ a grace to report). Importing torch takes seconds on a loaded
    machine and must never count as a hang of the collective itself.

    Returns:
        ``(phase, ready_at)``: the phase whose deadline was missed (``startup`` or
        ``test``; None when every worker exited), and when the last worker was ready.
    """
    sel = selectors.DefaultSelector()
    for w in workers:
        assert w.proc.stdout is not None
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
    ready_at: float | None = None
    missed: str | None = None
    abandoned = False  # a worker died before the rendezvous: its peers would wait in vain
    while sel.get_map() and not abandoned:
        deadline = startup_deadline if ready_at is None else ready_at + timeout + _GRACE
        left = deadline - time.monotonic()
        if left <= 0:
            missed = "startup" if ready_at is None else "test"
            break
        for key, _ in sel.select(timeout=left):
            w = key.data
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                w.closed = True
                abandoned = abandoned or not w.ready
                continue
            if _heard(w, chunk, workers) and ready_at is None:
                ready_at = time.monotonic()
    for w in workers:
        if w.proc.poll() is None and (missed or abandoned):
            w.proc.kill()
        w.proc.wait()
        if not w.closed and w.proc.stdout is not None:
            w.feed(w.proc.stdout.read() or b"")
    sel.close()
    refused = next((why for why in (w.refusal() for w in workers) if why), None)
    if refused:  # every worker has exited: the probe refuses the node as the worker did
        guard = isolate.running_guard()
        isolate.refuse_now(refused, guard.scratch if guard else None)
    return missed, ready_at


def _heard(w: _Worker, chunk: bytes, workers: list[_Worker]) -> bool:
    """Act on a worker's output (relay rank 0's port); True once every worker is ready."""
    for line in w.feed(chunk):
        if line.startswith("port ") and w is workers[0]:
            for other in workers[1:]:
                other.tell_port(int(line.split()[1]))
        elif line.strip() == _READY:
            w.ready = True
    return all(x.ready for x in workers)


def _summary(op: str, workers: list[_Worker], missed: str | None, timeout: float,
             startup: float, start: float, ready_at: float | None) -> dict[str, Any]:
    reports = [w.report() for w in workers]
    if any(r.get("skip") for r in reports):
        return {"op": op, "skipped": next(r["skip"] for r in reports if r.get("skip"))}
    finished = [r for r in reports if r.get("finished")]
    bad_data = [r for r in finished if not r.get("data_ok")]
    errors = [r for r in reports if not r.get("finished")]
    status = "pass"
    if missed:
        status = "hang"
    elif errors:
        status = "error"
    elif bad_data:
        status = "wrong_data"
    busbw = [r["busbw_gbps"] for r in finished if r.get("busbw_gbps") is not None]
    not_ready = [w.rank for w in workers if not w.ready]
    return {
        "op": op,
        "status": status,
        # startup: some rank never reached the rendezvous within the start-up limit.
        "phase": missed,
        "backend": next((r.get("backend") for r in reports if r.get("backend")), None),
        "world": len(reports),
        "timeout": timeout,
        "startup_timeout": startup,
        "hung_ranks": (not_ready if missed == "startup" else
                       [r.get("rank") for r in errors]) if missed else [],
        "errors": [f"rank {r.get('rank')}: {r.get('error')}" for r in errors][:8],
        "mismatches": [f"rank {r.get('rank')}: {r.get('mismatch')}" for r in bad_data][:8],
        "busbw_gbps": min(busbw) if busbw else None,  # the slowest rank bounds the machine
        "startup_seconds": None if ready_at is None else ready_at - start,
        "seconds": time.monotonic() - start,
    }


def _limits(request: dict[str, Any]) -> tuple[float, float]:
    timeout = float(request["timeout"])
    return timeout, float(request.get("startup_timeout", 300.0))


def alltoall(request: dict[str, Any]) -> dict[str, Any]:
    """All-to-all across ``world`` local workers (one per GPU)."""
    if importlib.util.find_spec("torch") is None:
        return {"op": "alltoall", "skipped": "torch is not installed on this machine"}
    world = int(request["world"])
    timeout, startup = _limits(request)
    start = time.monotonic()
    base = {"op": "alltoall", "world": world, "bytes": int(request.get("bytes", 1 << 20)),
            "iterations": int(request.get("iterations", 5)), "timeout": timeout,
            "startup_timeout": startup, "master_addr": "127.0.0.1", "master_port": 0}
    env = _worker_env({"GLOO_SOCKET_IFNAME": "lo"})  # machine-local: loopback only
    # Every worker starts at once (importing torch takes seconds); rank 0 reports the
    # port of its store and the others read it on stdin.
    workers = [_Worker(r, _worker_argv({**base, "rank": r, "local_rank": r}), env,
                       port_later=r > 0) for r in range(world)]
    missed, ready_at = _supervise(workers, start + startup, timeout)
    return _summary("alltoall", workers, missed, timeout, startup, start, ready_at)


def allgather(request: dict[str, Any]) -> dict[str, Any]:
    """This machine's rank of an all-gather across ``nnodes`` machines."""
    if importlib.util.find_spec("torch") is None:
        return {"op": "allgather", "skipped": "torch is not installed on this machine"}
    timeout, startup = _limits(request)
    start = time.monotonic()
    config = {"op": "allgather", "world": int(request["nnodes"]), "rank": int(request["node_rank"]),
              "local_rank": 0, "bytes": int(request.get("bytes", 1 << 20)),
              "iterations": int(request.get("iterations", 5)), "timeout": timeout,
              "startup_timeout": startup,
              "master_addr": request["master_addr"], "master_port": int(request["master_port"])}
    extra = {"GLOO_SOCKET_IFNAME": request["gloo_ifname"]} if request.get("gloo_ifname") else {}
    workers = [_Worker(config["rank"], _worker_argv(config), _worker_env(extra), port_later=False)]
    missed, ready_at = _supervise(workers, start + startup, timeout)
    return _summary("allgather", workers, missed, timeout, startup, start, ready_at)


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
