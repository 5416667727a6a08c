"""brctl health over the real sshd cluster: injected faults on two machines, the rest clean.

Faults are injected only through the test inventory: node02's ``env`` puts the
fake pynvml (scripted: 2 volatile uncorrectable ECC errors on GPU 1) on its
PYTHONPATH; node03's fixture sysfs tree (``health.root: .../{node}``) has its
InfiniBand port DOWN; node04's kernel log holds an application Xid (13) that
must not count against the machine. The probe runs on the nodes' bare
``/usr/bin/python3`` (shipped as a zip over ssh) and reports ``$SSH``-side truth.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kits.cluster import SshCluster
from tests.kits.healthkit import (
    ACTIVE_PORT,
    DOWN_PORT,
    fake_nvml,
    healthy_gpus,
    kmsg_record,
    make_root,
    set_port,
)

pytestmark = pytest.mark.integration
# Until the paramiko transport lands on main this test cannot reach the cluster.

XID13 = "NVRM: Xid (PCI:0000:86:00): 13, pid=9001, name=pretrain, Graphics Exception: ESR"


def test_health_names_exactly_the_two_faulty_machines(
    ssh_cluster: SshCluster, tmp_path: Path, brctl: object, state_dir: Path
) -> None:
    names = ssh_cluster.names
    assert len(names) >= 4
    roots = tmp_path / "roots"
    env = {}
    for name in names:
        port = DOWN_PORT if name == names[2] else ACTIVE_PORT
        kmsg = [kmsg_record(1, 1_000_000, "Linux version 6.8")]
        if name == names[3]:
            kmsg.append(kmsg_record(2, 2_000_000, XID13))
        make_root(roots / name, ib={"mlx5_0": {"1": port}}, kmsg=kmsg, proc_link=True)
        gpus = healthy_gpus(8)
        if name == names[1]:
            gpus[1]["ecc_volatile"] = 2
        env[name] = fake_nvml(tmp_path / "nvml" / name, gpus)
    inv = ssh_cluster.write_inventory(
        tmp_path, node_env=env, python="/usr/bin/python3",
        extra={"health": {"root": str(roots) + "/{node}", "disk_paths": ["/"]}})

    first = brctl("-i", inv, "--json", "health")  # type: ignore[operator]
    assert first.exit_code == 1, first.stderr
    doc = first.json
    assert doc["schema"] == "brctl.health/1"
    assert sorted(doc["evict"]) == sorted([names[1], names[2]])
    assert "ecc: GPU1 (00000000:28:00.0): 2 volatile uncorrectable ECC errors" in doc["evict"][names[1]]
    assert "ib: mlx5_0/1: DOWN (Disabled)" in doc["evict"][names[2]]
    status = {n: v["status"] for n, v in doc["nodes"].items()}
    assert status == {names[0]: "ok", names[1]: "fail", names[2]: "fail", names[3]: "ok"}
    xid4 = next(c for c in doc["nodes"][names[3]]["checks"] if c["name"] == "xid")
    assert xid4["status"] == "ok" and "Xid 13" in xid4["message"]
    gpu1 = next(c for c in doc["nodes"][names[0]]["checks"] if c["name"] == "gpu_count")
    assert gpu1 == {"name": "gpu_count", "status": "ok", "message": "8 GPUs"}

    # Deltas survive between runs through the state directory: node01's port flaps once.
    set_port(roots / names[0], "mlx5_0", "1", {**ACTIVE_PORT, "link_downed": 1})
    second = brctl("-i", inv, "health")  # type: ignore[operator]
    assert second.exit_code == 1
    out = second.stdout
    assert f"{names[0]}: fail ib: mlx5_0/1: link went down 1x since the last sample" in out
    assert f"evict {names[0]}" in out or names[0] in out.split("evict", 1)[1]
    assert f"{names[3]}: ok" in out
