"""Start-up: `brctl --help` and `brctl --version` against `clush --help`, side by side.

Run: .venv/bin/python benchmarks/startup.py [--runs N]
Each command is started N times (fresh processes); medians of wall time are reported.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def median_seconds(argv: list[str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    brctl = str(BIN / "brctl") if (BIN / "brctl").exists() else None
    base = [brctl] if brctl else [sys.executable, "-m", "brctl"]
    clush = shutil.which("clush", path=str(BIN)) or shutil.which("clush")
    rows = [
        ("python -c pass (floor)", [sys.executable, "-c", "pass"]),
        ("brctl --help", [*base, "--help"]),
        ("brctl --version", [*base, "--version"]),
    ]
    if clush:
        rows.append(("clush --help", [clush, "--help"]))
    results = {name: median_seconds(argv, args.runs) for name, argv in rows}
    print(f"{'command':28} {'median s':>9}")
    for name, secs in results.items():
        print(f"{name:28} {secs:9.3f}")
    if "clush --help" in results:
        ratio = results["brctl --help"] / results["clush --help"]
        print(f"brctl --help / clush --help = {ratio:.2f}")


if __name__ == "__main__":
    main()
