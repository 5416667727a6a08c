"""brctl daemon: detection latency (fault injected → decision) and controller CPU per poll.

Latency: the real loop (``operations.daemon.serve.serve``, ``--dry-run`` so it decides
and records without acting) over four ``connection: local`` machines running the
demo's stand-in job (examples/demo_job.py, its state in a temp dir) with the test
suite's fake NVML. Three faults, each on a fresh job and state database:

- gpu:   2 volatile uncorrectable ECC errors appear on one machine's fake NVML;
- hang:  one machine's ranks block in their data loader (→ stall → stack analysis);
- crash: every rank is killed (→ the diagnose ladder).

The time is from the injection to the ``decision`` event. Targets: gpu within
one poll interval + 2 s; hang within stall_after + the stack analysis.

CPU: one poll (health sweep + log tails + decision + state writes) of 64 nodes
whose transport answers at once with a recorded 8-GPU probe document and a log
tail (no ssh crypto), controller ``process_time`` per node. Target < 3 ms/node.

    python benchmarks/daemon.py [--runs 3] [--nodes 64] [--poll 1] [--stall 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from brctl.analysis.inventory import from_document  # noqa: E402
from brctl.operations.daemon.hooks import LiveHooks  # noqa: E402
from brctl.operations.daemon.loop import Daemon  # noqa: E402
from brctl.operations.daemon.serve import RunOptions, serve  # noqa: E402
from brctl.operations.jobadapter import JobAdapter  # noqa: E402
from brctl.operations.ledger.state import DaemonState  # noqa: E402
from brctl.remote.factory import RoutingTransport  # noqa: E402
from brctl.remote.fake import FakeTransport, Reply  # noqa: E402
from brctl.state import Store  # noqa: E402
from tests.kits.healthkit import fake_nvml, healthy_gpus  # noqa: E402

DEMO_JOB = ROOT / "examples" / "demo_job.py"
NODES = ["local1", "local2", "local3", "local4"]


def _nvml(base: Path, node: str, ecc: int) -> dict[str, str]:
    gpus = healthy_gpus(2)
    gpus[0]["ecc_volatile"] = ecc
    return fake_nvml(base / "nvml" / node, gpus)


def _inventory(base: Path, poll: float, stall: float) -> Any:
    py = sys.executable
    return from_document({
        "nodes": [{"name": n, "connection": "local", "gpus": 2, "env": _nvml(base, n, 0)}
                  for n in NODES],
        "job": {"name": "bench", "nodes": "local[1-4]", "tp": 2, "pp": 2,
                "process_match": "brctl-demo-train",
                "log_paths": [str(base / "job" / "train.log"), str(base / "job" / "rank*.err")],
                "restart_command": [py, str(DEMO_JOB), "launch", "--nodes", "{nodes}"]},
        "health": {"checks": ["gpu_count", "ecc", "process"]},
        "update": {"root": str(base / "{node}" / "train")},
        "daemon": {"poll_interval": poll, "stall_after": stall, "startup_grace": stall,
                   "metrics_port": 0},
    }, "bench")


def _demo(base: Path, *args: str) -> None:
    subprocess.run([sys.executable, str(DEMO_JOB), *args], check=True,
                   env=dict(os.environ, BRCTL_DEMO_DIR=str(base)))


def _steps(base: Path) -> int:
    try:
        return len((base / "job" / "train.log").read_text().splitlines())
    except OSError:
        return 0


def latency(kind: str, poll: float, stall: float) -> float:
    """Seconds from injecting ``kind`` to the daemon's decision."""
    base = Path(tempfile.mkdtemp(prefix="brctl-bench-daemon-"))
    env_before = os.environ.get("BRCTL_DEMO_DIR")
    os.environ["BRCTL_DEMO_DIR"] = str(base)  # the stand-in job's state dir, for its hooks
    stop, decided = threading.Event(), threading.Event()
    seen: dict[str, float] = {}
    try:
        inv = _inventory(base, poll, stall)
        _demo(base, "launch", "--nodes", ",".join(NODES))
        deadline = time.monotonic() + 60
        while _steps(base) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)

        def on_event(doc: dict[str, Any]) -> None:
            if doc["kind"] == "decision" and "t" in seen:
                seen["decision"] = time.monotonic()
                decided.set()

        transport = RoutingTransport()
        worker = threading.Thread(target=serve, args=(inv, transport, base / "state",
                                                      RunOptions(dry_run=True, metrics=False)),
                                  kwargs={"stop": stop, "on_event": on_event}, daemon=True)
        worker.start()
        time.sleep(3 * poll + 2)  # a few healthy polls first
        seen["t"] = time.monotonic()
        if kind == "gpu":
            _nvml(base, "local2", 2)
        elif kind == "hang":
            _demo(base, "inject", "hang", "local3")
        else:
            _demo(base, "stop")
        decided.wait(stall + 180)
        stop.set()
        worker.join(60)
        transport.close()
        return seen.get("decision", float("nan")) - seen["t"]
    finally:
        _demo(base, "stop")
        if env_before is None:
            os.environ.pop("BRCTL_DEMO_DIR", None)
        else:
            os.environ["BRCTL_DEMO_DIR"] = env_before
        shutil.rmtree(base, ignore_errors=True)


def poll_cost(nodes: int, polls: int, tmp: Path) -> float:
    """Controller CPU seconds per node of one daemon poll over ``nodes`` open connections."""
    env = fake_nvml(tmp / "nvml", healthy_gpus(8))
    request = {"root": "/", "checks": ["nvml", "process"], "process_match": "pretrain"}
    health_doc = subprocess.run(
        [sys.executable, "-m", "brctl.diagnostics.health_probe"], input=json.dumps(request).encode(),
        capture_output=True, env={**os.environ, **env, "PYTHONPATH": f"{env['PYTHONPATH']}:{ROOT}"},
        check=True).stdout.decode()
    step = [0]

    def handler(node: Any, argv: Any, stdin: Any) -> Reply:
        if argv[-1] == "brctl.diagnostics.logtail":
            lines = "".join(f" iteration {s}/ 500000 | lm loss: 2.1E+00\n"
                            for s in range(step[0] - 40, step[0]))
            return Reply(stdout=json.dumps({"files": [{"path": "/x/train.log", "mtime": 1.0,
                                                       "tail": lines}]}))
        return Reply(stdout=health_doc)

    names = f"gpu[001-{nodes:03d}]"
    inv = from_document({"nodes": [{"name": names, "gpus": 8}],
                         "job": {"nodes": names, "tp": 8, "log_paths": ["/x/*.log"],
                                 "restart_command": ["true"]},
                         "health": {"checks": ["gpu_count", "ecc", "retired_pages",
                                               "remapped_rows", "temperature", "throttle",
                                               "power", "nvlink", "pcie", "recovery_action",
                                               "process"]}}, "bench")
    transport = FakeTransport(handler)
    store = Store(tmp / "state")
    daemon = Daemon(inv, DaemonState(store, "bench"),
                    LiveHooks(inv, transport, store, tmp / "state"), JobAdapter(inv, 10),
                    owner="bench")
    daemon.start()
    costs = []
    for _ in range(polls + 1):
        step[0] += 10
        start = time.process_time()
        result = daemon.poll()
        costs.append((time.process_time() - start) / nodes)
        assert result.incident is None, result.incident
    store.close()
    return statistics.median(costs[1:])


def main() -> None:
    """Print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--stall", type=float, default=5.0)
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        per_node = poll_cost(args.nodes, 5, Path(tmp))
    print(f"poll of {args.nodes} open nodes: controller CPU {per_node * 1000:.2f} ms/node "
          "(target < 3 ms/node)")
    if args.skip_latency:
        return
    for kind, target in (("gpu", f"< poll {args.poll:g} s + 2 s"),
                         ("hang", f"< stall_after {args.stall:g} s + stack analysis"),
                         ("crash", "poll + diagnose ladder")):
        runs = [latency(kind, args.poll, args.stall) for _ in range(args.runs)]
        print(f"{kind:>5}: injected → decision median {statistics.median(runs):.1f} s "
              f"(min {min(runs):.1f}, max {max(runs):.1f}; target {target})")


if __name__ == "__main__":
    main()
