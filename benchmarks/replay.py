"""Replay rounds and wall time to a verdict: dual-phase vs bisection vs one at a time.

Part 1 (planner alone, no machines): for N machines (8 GPUs each, TP=8, PP=2) the
rounds dual-phase replay needs to name one faulty machine (simulated oracle over
``analysis.replay.groups.decide``: every machine enumerated up to N=64, a sample of 64
machines beyond) and two faulty machines (random pairs), against plain bisection
(halve the suspects each round: ceil(log2 N)) and one machine at a time (worst N,
mean (N+1)/2). Also the planner's own time.

Part 2 (real workload): 8 local machines x 2 CPU ranks (PP=2) and 16 x 1 (PP=2),
one of them corrupting (a test-only sitecustomize flips a matmul bit), run with
``operations.replay.replay`` over ``connection: local``; then the time of one
round of all groups and of one lone group, from which bisection (ceil(log2 N)
rounds, each a job as large as a full round) and one-at-a-time (N sequential
lone-group rounds, worst case) are estimated.

    python benchmarks/replay.py            # both parts (a few minutes on 2 cores)
    python benchmarks/replay.py --plan     # part 1 only (seconds)
"""

from __future__ import annotations

import argparse
import math
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from brctl.analysis.inventory import from_document  # noqa: E402
from brctl.analysis.replay.groups import (  # noqa: E402
    ReplayPlan,
    Verdict,
    decide,
    plan,
    reference_of,
    shape_of,
)
from brctl.analysis.replay.judge import GroupRun, judge_round  # noqa: E402
from brctl.analysis.topology import Topology  # noqa: E402
from brctl.core.errors import BrctlError  # noqa: E402


def simulate(p: ReplayPlan, faulty: set[str]) -> tuple[Verdict, int]:
    rounds = []
    while True:
        d = decide(p, rounds)
        if isinstance(d, Verdict):
            return d, len(rounds)
        runs = [GroupRun(g, "ok", ("a", "b:" + ",".join(sorted(set(g) & faulty))
                                   if set(g) & faulty else "b")) for g in d.groups]
        rounds.append(judge_round(d.kind, [runs], reference_of(rounds), d.suspects or None))


def part1(sizes: list[int]) -> None:
    rng = random.Random(7)
    print("| N machines | plan (ms) | groups/round | 1 fault: rounds (max) | 2 faults: "
          "rounds (max over pairs) | bisection | one at a time (worst / mean) |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        topo = Topology.build([f"m{i:05d}" for i in range(n)], 8, tp=8, pp=2)
        t0 = time.perf_counter()
        p = plan(shape_of(topo))
        plan_ms = (time.perf_counter() - t0) * 1000
        machines = list(topo.machines)
        sample = machines if n <= 64 else rng.sample(machines, 64)
        single = []
        for m in sample:
            v, r = simulate(p, {m})
            assert v.faulty == (m,), (m, v)
            single.append(r)
        pairs = [tuple(rng.sample(machines, 2)) for _ in range(8 if n > 1024 else 32)]
        double = []
        for pair in pairs:
            v, r = simulate(p, set(pair))
            assert set(v.faulty) == set(pair) or v.verdict == "ambiguous", (pair, v)
            double.append(r)
        print(f"| {n:,} | {plan_ms:.1f} | {len(p.round1):,} | {max(single)} | {max(double)} | "
              f"{math.ceil(math.log2(n))} | {n:,} / {(n + 1) / 2:,.1f} |")


def sweep(max_machines: int, only: list[int] | None = None) -> None:
    """Rounds to name one fault over every shape: tp 1-8, pp 1-16, cp 1-2, 8-GPU machines.

    Machine counts m·2^a (m odd, 1-15) up to ``max_machines``, banded; for every
    (tp, pp, cp) whose default replay plan can vote, the worst case over every
    position of a round-1 group (the groups are alike) of the pure decoder
    against the simulated oracle. "not named" would be one fault left ambiguous;
    "NaN only": 3 machines that each hold the whole model, where a finite corruption
    looks the same as the two others corrupting alike (ambiguous, said so) and a
    NaN/inf one is named (its worst round count in brackets).
    """
    from collections import Counter

    sizes = only or sorted({m << a for m in range(1, 16, 2) for a in range(15)
                            if m << a <= max_machines})
    print("| machines | shapes | rounds to name one fault: shapes | worst shape | NaN only |"
          " not named | CPU |")
    print("|---|---|---|---|---|---|---|")
    band_top = 16
    hist: Counter[int] = Counter()
    worst: tuple[int, str] = (0, "")
    failed, t0, low = 0, time.process_time(), 1
    nan_only: list[int] = []
    for i, n in enumerate(sizes):
        for tp in (1, 2, 4, 8):
            for pp in range(1, 17):
                for cp in (1, 2):
                    try:
                        topo = Topology.build([f"m{j:05d}" for j in range(n)], 8, tp=tp,
                                              pp=pp, cp=cp)
                        p = plan(shape_of(topo))
                    except BrctlError:  # shapes that do not divide, or machines sharing stages
                        continue
                    if not p.can_vote:
                        continue
                    r = p.rounds_single_fault()
                    if r is None:
                        nan = p.rounds_single_fault("nan")
                        if nan is None:
                            failed += 1
                        else:
                            nan_only.append(nan)
                        continue
                    hist[r] += 1
                    label = (f"{n} machines tp{tp} pp{pp} cp{cp}: {len(p.round1)} groups "
                             f"of {p.shape.slots}")
                    worst = max(worst, (r, label))
        if i + 1 == len(sizes) or sizes[i + 1] > band_top:
            counts = ", ".join(f"{r} rounds: {c}" for r, c in sorted(hist.items()))
            nans = f"{len(nan_only)} ({max(nan_only)})" if nan_only else "0"
            print(f"| {low:,}-{n:,} | {sum(hist.values()) + failed + len(nan_only)} | {counts} | "
                  f"{worst[0]} ({worst[1]}) | {nans} | {failed} | "
                  f"{time.process_time() - t0:.0f} s |", flush=True)
            hist, worst, failed, t0, low = Counter(), (0, ""), 0, time.process_time(), n + 1
            nan_only = []
            while i + 1 < len(sizes) and sizes[i + 1] > band_top:
                band_top *= 4


def _children_cpu() -> float:
    """User+sys seconds of finished child processes (ranks are waited for by their probe)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _inventory(n: int, gpus: int, faulty: str, fault_dir: Path) -> object:
    nodes = [{"name": f"m{i:02d}", "connection": "local", "gpus": gpus,
              "python": sys.executable,
              "env": {"PYTHONPATH": str(fault_dir)} if f"m{i:02d}" == faulty else {}}
             for i in range(1, n + 1)]
    return from_document({"ssh": {"fanout": 64}, "nodes": nodes,
                          "job": {"nodes": f"m[01-{n:02d}]", "pp": 2}}, "bench")


def part2(shapes: list[tuple[int, int]]) -> None:
    sys.path.insert(0, str(ROOT))
    from brctl.operations.replay import BuiltinWorkload, RoundLauncher, replay
    from brctl.remote.local import LocalTransport
    from tests.kits.replay_fault import write_fault

    print("| machines x ranks | replay: rounds, wall (CPU) to verdict | one round, all groups: "
          "wall (CPU) | one lone group: wall (CPU) | bisection (est.) | one at a time, worst (est.) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        fault = Path(tmp) / "fault"
        write_fault(fault)
        port = random.SystemRandom().randrange(20000, 30000)
        for n, gpus in shapes:
            inv = _inventory(n, gpus, "m03", fault)
            wl = BuiltinWorkload(steps=3, device="cpu")
            t0, c0 = time.perf_counter(), _children_cpu()
            report = replay(LocalTransport(), inv, workload=wl, port_base=port)  # type: ignore[arg-type]
            wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
            port += 100
            assert report.verdict.faulty == ("m03",), report.verdict
            p = report.plan
            launcher = RoundLauncher(LocalTransport(), inv, p, wl, 300.0, port, 64)  # type: ignore[arg-type]
            port += 100
            t0, c0 = time.perf_counter(), _children_cpu()
            launcher.run(p.round1)
            t_round, c_round = time.perf_counter() - t0, _children_cpu() - c0
            t0, c0 = time.perf_counter(), _children_cpu()
            launcher.run(p.round1[:1])
            t_one, c_one = time.perf_counter() - t0, _children_cpu() - c0
            bisect = math.ceil(math.log2(n)) * t_round
            print(f"| {n} x {gpus} | {len(report.rounds)}, {wall:.1f} s ({cpu:.0f} s) | "
                  f"{t_round:.1f} s ({c_round:.0f} s) | {t_one:.1f} s ({c_one:.1f} s) | "
                  f"{math.ceil(math.log2(n))} rounds, {bisect:.0f} s | "
                  f"{n} rounds, {n * t_one:.0f} s |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="store_true", help="planner only (part 1)")
    ap.add_argument("--sizes", default="8,16,64,256,1024,4096,10000")
    ap.add_argument("--sweep", type=int, metavar="N", default=0,
                    help="only the round-bound sweep over every shape up to N machines")
    ap.add_argument("--sweep-sizes", default="",
                    help="with --sweep: only these machine counts (comma-separated)")
    args = ap.parse_args()
    if args.sweep:
        sweep(args.sweep, [int(x) for x in args.sweep_sizes.split(",")] if args.sweep_sizes
              else None)
        return
    part1([int(s) for s in args.sizes.split(",")])
    if not args.plan:
        print()
        part2([(8, 2), (16, 1)])


if __name__ == "__main__":
    main()
