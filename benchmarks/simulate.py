"""brctl simulate: CPU time of three months of a 1,200-machine job, and the ByteRobust check.

``python benchmarks/simulate.py``: best-of-5 ``process_time`` of one run (the
built-in ByteRobust mix, 8 standbys, 30-minute checkpoints), then the mean ETTR of
10 runs of a 9,600-GPU job with the paper's fast paths (1-minute checkpoints,
2-minute restarts, 1-minute standby swaps and diagnosis) beside the paper's 97 %.
"""

from __future__ import annotations

import os
import time

from brctl.analysis.daemon.simulate import Durations, Scenario, byterobust_mix, run, simulate


def main() -> None:
    sc = Scenario(1200, 90, 1800.0, 8, byterobust_mix())
    times = []
    for seed in range(5):
        start = time.process_time()
        result = run(sc, seed)
        times.append(time.process_time() - start)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"3 months, 1200 machines, {result.incidents} incidents: best {min(times):.3f} s CPU, "
          f"worst {max(times):.3f} s (target < 5 s)")
    fast = Scenario(1200, 90, 60.0, 8, byterobust_mix(),
                    durations=Durations(restart=120.0, swap=60.0, diagnose=60.0))
    summary = simulate(fast, runs=10, seed=0)
    print(f"9,600 GPUs, 3 months, paper-like fast paths: ETTR {summary.ettr:.2%} "
          f"(p10 {summary.percentile(0.1):.2%}, p90 {summary.percentile(0.9):.2%}); paper 97 %")


if __name__ == "__main__":
    main()
