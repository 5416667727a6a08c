"""A backup plan is the same under any hash seed (this file starts processes).

Sets and dicts of machine names iterate in another order in every process
(``PYTHONHASHSEED``), so two calls in one process cannot show that the plan does not
depend on that order; two interpreters with different seeds can.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.kits.waiting import scaled

ROOT = Path(__file__).resolve().parents[2]
PLANS = """
import json, sys
from brctl.analysis.placement.plan import plan_backups
from brctl.analysis.topology import Topology
out = []
for machines, gpus, tp, pp, cp, ep, order, per_rack in json.loads(sys.argv[1]):
    names = [f"n{i:03d}" for i in range(machines)]
    topo = Topology.build(names, gpus, tp=tp, pp=pp, cp=cp, ep=ep, order=order)
    domains = {m: f"r{i // per_rack}" for i, m in enumerate(names)} if per_rack else None
    plan = plan_backups(topo, domains)
    out.append({"placements": [p.to_json() for p in plan.placements], "notes": list(plan.notes)})
print(json.dumps(out))
"""
# pairs across racks; every dp group on every machine (fallback); pp across 4-machine racks
SHAPES = [(24, 4, 4, 3, 1, 1, "tp-cp-ep-pp-dp", 6), (8, 8, 8, 1, 1, 1, "tp-cp-ep-dp-pp", 0),
          (16, 8, 8, 2, 1, 1, "tp-cp-ep-dp-pp", 4)]


def test_a_plan_is_the_same_under_two_hash_seeds() -> None:
    plans = [subprocess.run([sys.executable, "-c", PLANS, json.dumps(SHAPES)], cwd=ROOT,
                            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=scaled(120), check=True).stdout
             for seed in ("1", "2")]
    assert len(json.loads(plans[0])) == len(SHAPES)
    assert plans[0] == plans[1]
