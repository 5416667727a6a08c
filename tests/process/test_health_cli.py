"""brctl health end to end on local machines (connection: local) with fixture roots."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from tests.kits.healthkit import ACTIVE_PORT, DOWN_PORT, fake_nvml, healthy_gpus, make_root, set_port


def write_inv(tmp_path: Path, nodes: dict[str, dict[str, str]], health: dict[str, Any],
              python: str = sys.executable, job: bool = False, gpus: int = 2) -> Path:
    inv: dict[str, Any] = {
        "nodes": [{"name": n, "connection": "local", "gpus": gpus, "python": python,
                   "env": {**env, "HOME": str(tmp_path / "home")}} for n, env in nodes.items()],
        "health": {"root": str(tmp_path / "roots") + "/{node}", **health},
    }
    if job:
        inv["job"] = {"nodes": ",".join(nodes), "process_match": "brctl-no-such-trainer"}
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(inv))
    return path


def cluster(tmp_path: Path, down: str | None = None) -> dict[str, dict[str, str]]:
    nodes = {}
    for name in ("m1", "m2", "m3"):
        port = DOWN_PORT if name == down else ACTIVE_PORT
        make_root(tmp_path / "roots" / name, ib={"mlx5_0": {"1": port}})
        nodes[name] = fake_nvml(tmp_path / "nvml" / name, healthy_gpus(2))
    return nodes


def test_clean_nodes_fold_into_one_line(tmp_path: Path, brctl: Any, state_dir: Path) -> None:
    r = brctl("-i", write_inv(tmp_path, cluster(tmp_path), {}), "health")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines()[0] == "m[1-3]: ok"


def test_findings_json_and_evict(tmp_path: Path, brctl: Any, state_dir: Path) -> None:
    r = brctl("-i", write_inv(tmp_path, cluster(tmp_path, down="m2"), {}), "--json", "health")
    assert r.exit_code == 1
    doc = r.json
    assert doc["schema"] == "brctl.health/1"
    assert doc["evict"] == {"m2": "ib: mlx5_0/1: DOWN (Disabled)"}
    assert set(doc["nodes"]["m1"]) == {"status", "checks", "error", "seconds"}
    assert all(set(c) >= {"name", "status", "message"} for c in doc["nodes"]["m1"]["checks"])


def test_watch_prints_only_changes(tmp_path: Path, brctl: Any, state_dir: Path) -> None:
    inv = write_inv(tmp_path, cluster(tmp_path), {})
    waits: list[float] = []

    def flap(seconds: float) -> None:  # between the sweeps, m3's port goes down
        waits.append(seconds)
        set_port(tmp_path / "roots" / "m3", "mlx5_0", "1", DOWN_PORT)

    r = brctl("-i", inv, "health", "--watch", "0.1", "--count", "2", sleep=flap)
    assert waits == [0.1]
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    assert lines[0] == "m[1-3]: ok"
    changes = lines[1:]
    assert len(changes) == 2, changes
    assert changes[0].endswith("m3 node: ok -> fail")
    assert "m3 ib: ok -> fail: mlx5_0/1: DOWN (Disabled)" in changes[1]


def test_no_answer_is_incomplete(tmp_path: Path, brctl: Any, state_dir: Path) -> None:
    nodes = cluster(tmp_path)
    r = brctl("-i", write_inv(tmp_path, nodes, {}, python="/nonexistent/python3"), "health")
    assert r.exit_code == 3
    assert "m[1-3]: error" in r.stdout


def test_bad_health_section_is_a_clear_error(tmp_path: Path, brctl: Any, state_dir: Path) -> None:
    inv = write_inv(tmp_path, cluster(tmp_path), {"checks": ["ecc", "gpu_temp"]})
    r = brctl("-i", inv, "health")
    assert r.exit_code == 2
    assert "health.checks: unknown check 'gpu_temp'" in r.stderr
    inv = write_inv(tmp_path, cluster(tmp_path), {"disk_fail_free_percent": 140})
    r = brctl("-i", inv, "health")
    assert r.exit_code == 2 and "health.disk_fail_free_percent" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_local_example_checks_only_what_it_can_see(brctl: Any, state_dir: Path,
                                                      tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "local.yaml"
    r = brctl("-i", example, "--json", "health", "-w", "local1", env={"HOME": str(tmp_path)})
    assert r.exit_code == 0, r.stdout + r.stderr
    checks = r.json["nodes"]["local1"]["checks"]
    assert checks and all(c["status"] in ("ok", "warn", "skip") for c in checks), checks
    assert not {"gpu_count", "ecc", "xid"} & {c["name"] for c in checks}  # turned off, said so


def _gpu_checks(doc: dict[str, Any], node: str) -> set[tuple[str, str]]:
    return {(c["status"], c["message"]) for c in doc["nodes"][node]["checks"]
            if c["name"] in ("gpu_count", "ecc", "temperature")}


def test_nvml_unusable_on_a_gpu_machine_is_unknown_and_incomplete(
        tmp_path: Path, brctl: Any, state_dir: Path) -> None:
    nodes = cluster(tmp_path)
    nodes["m2"] = fake_nvml(tmp_path / "nvml" / "m2", [], init_error=9)  # driver not loaded
    r = brctl("-i", write_inv(tmp_path, nodes, {}), "--json", "health")
    assert r.exit_code == 3, r.stdout
    assert _gpu_checks(r.json, "m2") == {("unknown", "NVIDIA driver not loaded (nvmlInit failed)")}
    assert r.json["nodes"]["m2"]["status"] == "unknown"
    assert r.json["evict"] == {}  # could not look: never a reason to evict
    human = brctl("-i", write_inv(tmp_path, nodes, {}), "health")
    assert human.exit_code == 3
    assert "m2: unknown" in human.stdout and "NVIDIA driver not loaded" in human.stdout


def test_gpu_checks_turned_off_or_gpus_0_are_not_unknown(
        tmp_path: Path, brctl: Any, state_dir: Path) -> None:
    nodes = {n: fake_nvml(tmp_path / "nvml" / n, [], init_error=12) for n in ("m1", "m2")}
    for n in nodes:
        make_root(tmp_path / "roots" / n, ib={"mlx5_0": {"1": ACTIVE_PORT}})
    off = write_inv(tmp_path, nodes, {"checks": ["ib", "disk"]})
    assert brctl("-i", off, "health").exit_code == 0
    cpu_only = write_inv(tmp_path, nodes, {}, gpus=0)
    r = brctl("-i", cpu_only, "--json", "health")
    assert r.exit_code == 0, r.stdout
    assert _gpu_checks(r.json, "m1") == {("skip", "no GPUs on this machine (gpus: 0)")}


def test_machines_that_do_not_answer_are_incomplete_over_a_fake_transport(
        tmp_path: Path, brctl: Any) -> None:
    """The real command, run in-process over a FakeTransport (``brctl(..., transport=)``)."""
    from brctl.core.transport import NodeState
    from brctl.remote.fake import FakeTransport, Reply

    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "m[1-3]", "address": "10.0.0.[1-3]"}]}))
    fake = FakeTransport(lambda node, argv, stdin: Reply(stdout="", stderr="no route",
                                                         state=NodeState.UNREACHABLE))
    r = brctl("-i", inv, "health", transport=fake)
    assert r.exit_code == 3, r.stderr
    assert r.stdout.startswith("m[1-3]: unreachable")
    assert sorted(c.node for c in fake.calls) == ["m1", "m2", "m3"]
