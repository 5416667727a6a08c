"""Write the demo's inventory: examples/demo.yaml with the machines' python and absolute paths.

Probes run isolated from ``/`` and take only absolute ``PYTHONPATH`` entries, and they run
the inventory's ``python``: the demo gives its local machines the project's own (torch, so
the diagnose ladder's all-to-all and all-gather really run over gloo). Checkpoint backups
must live where every path component is the operator's and not group/other writable
(never under /tmp): each machine gets ``BACKUP/<machine>`` as ``ckpt.backup_dir``.

Usage: python scripts/demo_inventory.py SRC DST PYTHON ROOT BACKUP
"""

from __future__ import annotations

import os
import sys

import yaml


def main(src: str, dst: str, python: str, root: str, backup: str) -> None:
    """Write ``dst`` from ``src``: ``ssh.python`` set, ``PYTHONPATH`` entries made absolute,
    each machine's backup root under ``backup``."""
    with open(src, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    doc["ssh"]["python"] = python
    doc["ckpt"]["backup_dir"] = "$DEMO_BACKUP"  # expanded on each machine, like ckpt.dir
    for entry in doc["nodes"] + doc.get("standby", []):
        env = entry.setdefault("env", {})
        env["DEMO_BACKUP"] = os.path.join(backup, entry["name"])
        if env.get("PYTHONPATH"):
            env["PYTHONPATH"] = ":".join(os.path.join(root, p) for p in env["PYTHONPATH"].split(":"))
    with open(dst, "w", encoding="utf-8") as f:
        yaml.safe_dump(doc, f, sort_keys=False)


if __name__ == "__main__":
    main(*sys.argv[1:6])
