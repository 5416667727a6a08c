"""``brctl replay`` rounds end to end without torch: a ``--command`` workload.

The operation runs over ``FakeTransport`` (argv checked, fingerprints scripted) and,
through the CLI, over local machines running a small Python "trainer" whose ranks
meet in a directory keyed by ``{master_port}`` (a file-system rendezvous), so the
placeholders, the per-group ports and rank 0's ``brctl-fingerprint`` lines are real.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from brctl.analysis.inventory import from_document
from brctl.core.nodeset import fold
from brctl.core.transport import Node, NodeState
from brctl.operations.replay import command_workload, parse_fingerprints, replay
from brctl.remote.fake import FakeTransport, Reply

TEMPLATE = "train --nodes {nodes} --rank {node_rank} --port {master_port} --addr {master_addr}"


def inventory(n: int, gpus: int, tp: int, pp: int) -> Any:
    return from_document({
        "nodes": [{"name": f"g[01-{n:02d}]", "address": f"10.0.0.[1-{n}]", "gpus": gpus}],
        "job": {"nodes": f"g[01-{n:02d}]", "tp": tp, "pp": pp},
    }, "test.yaml")


def scripted(faulty: set[str], seen: list[list[str]] | None = None) -> FakeTransport:
    def handler(node: Node, argv: Sequence[str], _stdin: bytes | None) -> Reply:
        if seen is not None:
            seen.append(list(argv))
        nodes = argv[argv.index("--nodes") + 1].split(",")
        if argv[argv.index("--rank") + 1] != "0":
            return Reply()
        bad = sorted(set(nodes) & faulty)
        lines = [f"brctl-fingerprint {s} {'bad' + ''.join(bad) if bad and s else f'ok{s}'}"
                 for s in range(3)]
        return Reply(stdout="\n".join(["noise", *lines]) + "\n")
    return FakeTransport(handler)


def test_single_fault_found_in_two_rounds_and_argv_is_a_list() -> None:
    from tests.process.test_progress import StageRecorder

    seen: list[list[str]] = []
    inv = inventory(8, 2, 1, 2)
    track = StageRecorder()
    report = replay(scripted({"g03"}, seen), inv, workload=command_workload(TEMPLATE),
                    port_base=31000, track=track)
    # progress: each round a stage over its machines, each heard as it finished
    assert track.names() == ["round 1 (horizontal, 4 groups)", "round 2 (vertical, 4 groups)"]
    assert track.complete() and sorted(track.stages[0][1]) == [f"g{i:02d}" for i in range(1, 9)]
    assert (report.verdict.verdict, report.verdict.faulty) == ("found", ("g03",))
    assert [r.kind for r in report.rounds] == ["horizontal", "vertical"]
    assert int(report.exit_code) == 1
    first = seen[0]
    assert first[0] == "train" and len(first) == 9  # substituted per argument, no shell
    assert first[first.index("--addr") + 1] == "10.0.0.1"  # the group's first machine
    ports = {a[a.index("--port") + 1] for a in seen}
    assert len(ports) == 8  # a fresh rendezvous port for every group run


def test_two_faults_need_a_third_round_that_clears_the_false_candidates() -> None:
    inv = inventory(16, 8, 8, 2)  # the 4×4 grid, DP'=2
    report = replay(scripted({"g06", "g09"}), inv, workload=command_workload(TEMPLATE), dp=2)
    v = report.verdict
    assert (v.verdict, set(v.faulty)) == ("found", {"g06", "g09"})
    assert [r.kind for r in report.rounds] == ["horizontal", "vertical", "confirm"]
    confirm = report.rounds[2]
    assert {g.suspect for g in confirm.groups} == {"g05", "g06", "g09", "g10"}
    assert {"g05", "g10"} <= set(v.cleared)


def test_a_group_that_fails_is_incomplete_not_sdc() -> None:
    def handler(node: Node, argv: Sequence[str], _stdin: bytes | None) -> Reply:
        if node.name == "g02":
            return Reply(stderr="CUDA error: an illegal memory access\n", exit_code=1)
        if node.name == "g06":
            return Reply(state=NodeState.UNREACHABLE, exit_code=None)
        return Reply(stdout="brctl-fingerprint 0 aa\n")
    report = replay(FakeTransport(handler), inventory(8, 2, 1, 2),
                    workload=command_workload(TEMPLATE))
    assert report.verdict.verdict == "incomplete" and int(report.exit_code) == 3
    bad = [g for g in report.rounds[0].groups if g.status == "incomplete"]
    assert [g.nodes for g in bad] == [("g02", "g06")]
    assert "illegal memory access" in (bad[0].runs[0].error or "")


def test_parse_fingerprints() -> None:
    out = "x\nbrctl-fingerprint 1 NaN\nbrctl-fingerprint 0 abc\nbrctl-fingerprint 1 inf\n"
    assert parse_fingerprints(out) == ("abc", "inf")


# -- through the CLI, on local machines ------------------------------------------------

TRAINER = r'''
import hashlib, os, sys, time
nodes, rank, nnodes, port, root = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
meet = os.path.join(root, port)
os.makedirs(meet, exist_ok=True)
value = "bad" if os.environ.get("FAKE_SDC") else "ok"
with open(os.path.join(meet, "%d.tmp" % rank), "w") as fh:
    fh.write(value)
os.replace(os.path.join(meet, "%d.tmp" % rank), os.path.join(meet, str(rank)))
if rank == 0:
    while len([f for f in os.listdir(meet) if not f.endswith(".tmp")]) < nnodes:
        time.sleep(0.02)
    parts = "".join(open(os.path.join(meet, str(r))).read() for r in range(nnodes))
    for step in range(3):
        print("brctl-fingerprint %d %s" % (step, hashlib.sha256((parts + str(step)).encode()).hexdigest()[:16]))
'''


def local_inventory(tmp_path: Path, faulty: str | None) -> Path:
    nodes = []
    for i in range(1, 9):
        entry: dict[str, Any] = {"name": f"m{i}", "connection": "local", "gpus": 2}
        if f"m{i}" == faulty:
            entry["env"] = {"FAKE_SDC": "1"}
        nodes.append(entry)
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"nodes": nodes, "job": {"nodes": "m[1-8]", "pp": 2}}))
    return path


def command(tmp_path: Path) -> str:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    return (f"{sys.executable} {script} {{nodes}} {{node_rank}} {{nnodes}} {{master_port}} "
            f"{tmp_path / 'meet'}")


def test_cli_names_the_faulty_local_machine(tmp_path: Path, brctl: Any) -> None:
    r = brctl("-i", local_inventory(tmp_path, "m6"), "--json", "replay", "--command",
              command(tmp_path), "--timeout", "60")
    assert r.exit_code == 1, r.stderr
    doc = r.json
    assert doc["schema"] == "brctl.replay/1"
    assert (doc["verdict"], doc["faulty"]) == ("found", ["m6"])
    assert len(doc["rounds"]) == 2
    group = doc["rounds"][0]["groups"][1]
    assert set(group) >= {"members", "fingerprint", "deviant"}
    assert group["members"] == ["m2", "m6"] and group["deviant"] is True
    assert [g["deviant"] for g in doc["rounds"][0]["groups"]].count(True) == 1


def test_cli_none_is_exit_0_and_prints_tables(tmp_path: Path, brctl: Any) -> None:
    r = brctl("-i", local_inventory(tmp_path, None), "replay", "--command", command(tmp_path),
              "--repeat", "2")
    assert r.exit_code == 0, r.stderr
    assert "round 1 (horizontal)" in r.stdout and "none" in r.stdout
    assert "round 2 (vertical)" not in r.stdout


def test_plan_only_runs_nothing(tmp_path: Path, brctl: Any) -> None:
    r = brctl("-i", local_inventory(tmp_path, None), "--json", "replay", "--plan-only")
    assert r.exit_code == 0
    doc = r.json
    assert doc["verdict"] is None and doc["plan"]["grid"] is True
    assert [g["members"] for g in doc["rounds"][0]["groups"]] == [
        ["m1", "m5"], ["m2", "m6"], ["m3", "m7"], ["m4", "m8"]]
    assert doc["rounds"][1]["kind"] == "vertical"
    # the round bound for this shape, and --max-rounds' default (the bound plus two)
    assert doc["plan"]["rounds_single_fault"] == 2 and doc["plan"]["max_rounds_default"] == 4
    assert not (tmp_path / "meet").exists()
    text = brctl("-i", local_inventory(tmp_path, None), "replay", "--plan-only")
    assert text.exit_code == 0
    assert "at most 2 round(s) to name one faulty machine" in text.stdout


def test_a_dp_that_builds_another_job_exits_2(tmp_path: Path, brctl: Any) -> None:
    """--dp 6 on 6 machines of 4 GPUs, PP=3, pp before dp silently ran DP'=8."""
    nodes = [{"name": f"m{i}", "connection": "local", "gpus": 4} for i in range(1, 7)]
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"nodes": nodes, "job": {
        "nodes": "m[1-6]", "pp": 3, "order": "tp-cp-ep-pp-dp"}}))
    r = brctl("-i", path, "replay", "--dp", "6", "--plan-only")
    assert r.exit_code == 2
    assert "DP'=8, not 6" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--dp", "3"], "--dp 3: the replay DP' must be one of 2, 4, 8"),
    (["--command", "train {rank}"], "--command: unknown placeholder {rank}"),
    (["--command", "train 'unclosed"], "No closing quotation"),
    (["--repeat", "0"], "--repeat 0"),
    (["--device", "tpu"], "--device 'tpu'"),
])
def test_bad_options_exit_2_naming_what(tmp_path: Path, brctl: Any, args: list[str],
                                        message: str) -> None:
    r = brctl("-i", local_inventory(tmp_path, None), "replay", *args)
    assert r.exit_code == 2
    assert message in r.stderr and "Traceback" not in r.stderr


def test_no_job_is_an_input_error(tmp_path: Path, brctl: Any) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"name": "m1", "connection": "local"}]}))
    r = brctl("-i", path, "replay")
    assert r.exit_code == 2 and "no job" in r.stderr


def test_a_taken_rendezvous_port_is_retried_on_a_fresh_one() -> None:
    taken: set[str] = set()

    def handler(node: Node, argv: Sequence[str], _stdin: bytes | None) -> Reply:
        port = argv[argv.index("--port") + 1]
        if node.name == "g01" and not taken:
            taken.add(port)
            return Reply(stderr="RuntimeError: The server socket has failed to listen on any "
                                "local network address. Address already in use\n", exit_code=1)
        if node.name == "g01":
            assert port not in taken  # the retry moved to a fresh port
        if argv[argv.index("--rank") + 1] != "0":
            return Reply()
        return Reply(stdout="brctl-fingerprint 0 aa\n")
    report = replay(FakeTransport(handler), inventory(8, 2, 1, 2),
                    workload=command_workload(TEMPLATE))
    assert report.verdict.verdict == "none" and taken


def test_nodes_folded_is_the_group_as_a_folded_node_set() -> None:
    seen: list[list[str]] = []
    template = TEMPLATE + " --set {nodes_folded}"
    replay(scripted({"g03"}, seen), inventory(8, 2, 1, 2), workload=command_workload(template),
           port_base=31000)
    folded = {tuple(a[a.index("--nodes") + 1].split(",")): a[a.index("--set") + 1] for a in seen}
    assert all(value == fold(nodes) for nodes, value in folded.items())
    assert all(value.startswith("g[") for value in folded.values())  # not the plain list


def test_groups_of_a_round_that_share_a_machine_run_one_after_the_other() -> None:
    """A confirm round's control job is its suspect's job with the suspect swapped out, so
    the two share their other machines. Launched together, the shared machine's slot was
    overwritten by the second group: the first never got its rank and timed out
    (``incomplete``) on a real cluster."""
    import threading

    from brctl.operations.replay import RoundLauncher, replay_plan

    inv = inventory(8, 2, 1, 2)
    lock, busy, overlap, asked = threading.Lock(), set(), [], []

    def handler(node: Node, argv: Sequence[str], _stdin: bytes | None) -> Reply:
        with lock:
            if node.name in busy:
                overlap.append(node.name)
            busy.add(node.name)
            asked.append((node.name, argv[argv.index("--nodes") + 1]))
        try:
            if argv[argv.index("--rank") + 1] != "0":
                return Reply()
            return Reply(stdout="brctl-fingerprint 0 aa\n")
        finally:
            with lock:
                busy.discard(node.name)
    launcher = RoundLauncher(FakeTransport(handler), inv, replay_plan(inv),
                             command_workload(TEMPLATE), timeout=10, port_base=32000, fanout=8)
    runs = launcher.run([("g01", "g05"), ("g02", "g06"), ("g03", "g05")])
    assert [r.status for r in runs] == ["ok", "ok", "ok"], runs
    assert ("g05", "g01,g05") in asked and ("g05", "g03,g05") in asked
    assert not overlap
