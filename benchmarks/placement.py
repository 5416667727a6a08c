"""Benchmark checkpoint placement over a sweep of pipeline shapes at ~100k ranks.

``python benchmarks/placement.py [--runs 1] [--shapes all]``

For every shape (8-GPU machines, Megatron's default order, racks of 32
machines as failure domains, or the rack labelling the label names): CPU seconds of ``ConflictIndex.build`` +
``plan_backups`` + ``verify_plan`` (every group instance of every kind evicted,
exact loss probabilities for k = 1..4), whether every placement meets the rule,
how the machines were placed (pairs, rings, shared, fallback), same-rack
backups, and the largest number of foreign shards one machine holds. The
target is under 2 s per shape on one core; odd PP used to be quadratic
(595 s for tp8 pp3 at 96,000 ranks).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from brctl.analysis.placement.plan import ConflictIndex, plan_backups, verify_plan
from brctl.analysis.topology import Topology

GPUS = 8
# rack layout → machine index → rack: blocks of 32, and labellings that put the
# structured partner in the machine's own rack (parity: every cyclic odd-PP partner)
RACKS: dict[str, Callable[[int], int]] = {
    "32": lambda i: i // 32,
    "parity": lambda i: i % 2,
    "mod3": lambda i: i % 3,
    "random": lambda i: random.Random(i).randrange(400),
}
# label → (tp, pp, cp, ep, dp, racks): about 100k ranks each
SHAPES: dict[str, tuple[int, int, int, int, int, str]] = {
    "tp8 pp8": (8, 8, 1, 1, 1600, "32"),
    "tp8 pp3": (8, 3, 1, 1, 4000, "32"),
    "tp2 pp5": (2, 5, 1, 1, 10000, "32"),
    "tp8 pp8 cp2 ep4": (8, 8, 2, 4, 800, "32"),
    "tp8 pp1 cp2 ep4": (8, 1, 2, 4, 6250, "32"),
    "tp8 pp1 (no valid peer: fallback)": (8, 1, 1, 1, 12500, "32"),
    "tp2 pp4 dp12501 (stages end mid-machine)": (2, 4, 1, 1, 12501, "32"),
    "tp4 pp7": (4, 7, 1, 1, 3572, "32"),
    "tp1 pp16": (1, 16, 1, 1, 6250, "32"),
    "tp8 pp3, racks by parity": (8, 3, 1, 1, 4000, "parity"),
    "tp2 pp5, racks by parity": (2, 5, 1, 1, 10000, "parity"),
    "tp8 pp3, racks i mod 3": (8, 3, 1, 1, 4000, "mod3"),
    "tp8 pp3, 400 random racks": (8, 3, 1, 1, 4000, "random"),
}


def bench(tp: int, pp: int, cp: int, ep: int, dp: int, racks_by: str, runs: int
          ) -> dict[str, object]:
    """CPU seconds (median of ``runs``) and the plan's figures for one shape."""
    world = tp * pp * cp * dp
    machines = [f"gpu{i:05d}" for i in range(world // GPUS)]
    racks = {m: f"r{RACKS[racks_by](i)}" for i, m in enumerate(machines)}
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        topo = Topology.build(machines, GPUS, tp=tp, pp=pp, cp=cp, ep=ep)
        index = ConflictIndex.build(topo)
        plan = plan_backups(topo, racks, index)
        result = verify_plan(topo, plan.backups(), index)
        times.append(time.process_time() - t0)
    how = Counter(p.how for p in plan.placements)
    load = Counter(plan.backups().values())
    return {"ranks": world, "machines": len(machines), "cpu": statistics.median(times),
            "ok": plan.ok and result.ok, "how": ", ".join(f"{k} {v}" for k, v in sorted(how.items())),
            "same_rack": sum(p.same_domain for p in plan.placements),
            "max_load": max(load.values()), "p4": float(result.loss_probability[4] or 0.0)}


def main(argv: list[str] | None = None) -> int:
    """Print a Markdown table of the sweep."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--shapes", default="all", help="comma-separated labels, or all")
    args = ap.parse_args(argv)
    chosen = SHAPES if args.shapes == "all" else {k: SHAPES[k] for k in args.shapes.split(",")}
    t0 = time.process_time()
    sum(range(10**7))
    print(f"calibration: sum(range(10**7)) took {time.process_time() - t0:.2f} s CPU")
    print("| shape | ranks | machines | index + plan + verify (CPU) | rule met | placed as "
          "| same rack | max shards held | P(loss), k=4 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, shape in chosen.items():
        r = bench(*shape, runs=args.runs)
        print(f"| {label} | {r['ranks']:,} | {r['machines']:,} | {r['cpu']:.2f} s | {r['ok']} | "
              f"{r['how']} | {r['same_rack']} | {r['max_load']} | {r['p4']:.2e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
