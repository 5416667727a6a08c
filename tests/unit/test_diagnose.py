"""Unit tests of brctl diagnose: playbooks, parsers, stage judges, pairing and the decision."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest

from brctl.analysis.diagnose import stages as st
from brctl.analysis.diagnose.decide import PastConclusion, decide
from brctl.analysis.playbook import NodeEvidence, Playbook, classify, exception_lines
from brctl.core.errors import InputError
from brctl.load.playbooks import load_playbooks, playbook_dirs
from brctl.operations.diagnose import _node_evidence
from brctl.remote.probes import probe_call

DATA = Path(__file__).parent / "data"
BOOKS = load_playbooks(playbook_dirs(None, {}))


def _ev(node: str, log: str = "", kern: str = "") -> NodeEvidence:
    lines = (DATA / log).read_text().splitlines() if log else []
    xid = (DATA / kern).read_text().splitlines() if kern else []
    return _node_evidence(node, lines, [ln for ln in xid if "Xid" in ln])


def _classify(**per_node: tuple[str, str]) -> Any:
    return classify({n: _ev(n, *spec) for n, spec in per_node.items()}, BOOKS)


@pytest.mark.parametrize(("log", "kern", "symptom"), [
    ("logs_nccl_timeout.log", "", "nccl"),
    ("logs_cuda_illegal.log", "", "cuda-error"),
    ("logs_user_code.log", "", "user-code"),
    ("logs_nan.log", "", "nan-loss"),
    ("logs_oom.log", "", "oom"),
    ("", "kern_xid79.log", "gpu-lost"),
    ("", "", "unknown"),
])
def test_every_shipped_playbook_classifies_its_real_format_log(log: str, kern: str,
                                                               symptom: str) -> None:
    found = _classify(gpu1=("", ""), gpu2=(log, kern))
    assert found.playbook.name == symptom
    assert found.nodes == (("gpu2",) if symptom != "unknown" else ())


def test_torchrun_exit_code_and_xid_are_parsed() -> None:
    ev = _ev("n", "logs_nccl_timeout.log", "kern_xid79.log")
    assert ev.exit_codes == (-6,)
    assert ev.xids == (79,)


def test_user_code_beats_nccl_timeouts_of_its_peers_but_not_a_device_error() -> None:
    # rank 0's KeyError makes every other rank time out in NCCL: the cause is the code.
    found = _classify(a=("logs_user_code.log", ""), b=("logs_nccl_timeout.log", ""))
    assert found.playbook.name == "user-code" and found.nodes == ("a",)
    found = _classify(a=("logs_user_code.log", ""), b=("logs_cuda_illegal.log", ""))
    assert found.playbook.name == "cuda-error"


def test_exception_lines_strip_rank_prefixes() -> None:
    lines = (DATA / "logs_user_code.log").read_text().splitlines()
    assert exception_lines(lines) == ["KeyError: 'tokens_v2'"]


def test_hang_and_hardware_xids() -> None:
    hang = NodeEvidence("n", ("[rank0]: no progress for 900 s (hang detected)",))
    assert classify({"n": hang}, BOOKS).playbook.name == "hang"
    ecc = _node_evidence("n", [], ["NVRM: Xid (PCI:0000:86:00): 48, pid=1, name=python, "
                                   "An uncorrectable double bit error (DBE) has been detected"])
    assert classify({"n": ecc}, BOOKS).playbook.name == "xid-hardware"


def test_forced_symptom_and_unknown_name() -> None:
    found = classify({"n": NodeEvidence("n")}, BOOKS, forced="hang")
    assert found.playbook.name == "hang" and found.forced and found.nodes == ()
    with pytest.raises(InputError, match="--symptom nope"):
        classify({"n": NodeEvidence("n")}, BOOKS, forced="nope")


@pytest.mark.parametrize(("text", "where"), [
    ("name: x\nsymptom: y\nmatch: [{log: '('}]\n", "match[0].log"),
    ("name: x\nsymptom: y\nmatch: [{log: a, xid: [1]}]\n", "match[0]"),
    ("name: x\nsymptom: y\nmatch: [{log: a}]\nstages: [{name: eud}, {name: eud}]\n", "stages[1].name"),
    ("name: x\nsymptom: y\nmatch: [{log: a}]\nstages: [{name: alltoall, level: '3'}]\n",
     "stages[0].level"),
    ("name: x\nsymptom: y\nmatch: [{log: a}]\ndecision: {on_match: reboot}\n", "decision.on_match"),
    ("name: x\nsymptom: y\nmatch: [{log: a}]\ncolour: red\n", "colour"),
    ("name: x\nsymptom: y\n", "match"),
    ("name: x\nsymptom: y\nmatch: [{log: a}]\nstages: [{name: eud, timeout: -1}]\n",
     "stages[0].timeout"),
])
def test_bad_playbook_names_file_and_key(tmp_path: Path, text: str, where: str) -> None:
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(InputError) as err:
        load_playbooks([tmp_path])
    assert f"bad.yaml: {where}" in err.value.message


def test_user_playbooks_extend_and_override(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text("name: nccl\nsymptom: ours\nmatch: [{log: boom}]\n")
    (tmp_path / "new.yaml").write_text("name: disk\nsymptom: disk full\nmatch: [{log: ENOSPC}]\n")
    books = {b.name: b for b in load_playbooks(playbook_dirs(str(tmp_path), {}))}
    assert books["nccl"].symptom == "ours" and "disk" in books and "gpu-lost" in books


def test_playbook_search_path(tmp_path: Path) -> None:
    share = tmp_path / "prefix" / "share" / "brctl" / "playbooks"
    share.mkdir(parents=True)
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    dirs = playbook_dirs(str(tmp_path), {"BRCTL_PLAYBOOKS": str(env_dir)},
                         builtin=lambda name: share)
    assert dirs == [share, env_dir, tmp_path]
    from brctl.load.resources import data_dir
    assert playbook_dirs(None, {}) == [data_dir("playbooks")]
    assert (playbook_dirs(None, {})[0] / "nccl.yaml").is_file()
    # Nothing shipped (a broken install): only the user's directories; none → a clear error.
    assert playbook_dirs(str(env_dir), {}, builtin=lambda name: None) == [env_dir]
    with pytest.raises(InputError, match="no playbooks found"):
        load_playbooks(playbook_dirs(None, {}, builtin=lambda name: None))
    with pytest.raises(InputError, match="--playbooks"):
        playbook_dirs(str(tmp_path / "missing"), {})


def _dcgm(name: str, code: int) -> dict[str, Any]:
    return {"exit_code": code, "stdout": (DATA / name).read_text(), "stderr": ""}


def test_dcgm_failing_tree_exit_226() -> None:
    v = st.parse_dcgm("n", _dcgm("dcgm_diag_fail.json", 226))
    assert v.status == "fail"
    assert "GPU 1: memory: Fail" in v.evidence[0] and "error_id 83" in v.evidence[0]
    assert v.details["driver_version"] == "570.124.06" and v.details["eud_version"] == "2.5.0"


def test_dcgm_pass_with_warnings_is_not_clean() -> None:
    v = st.parse_dcgm("n", _dcgm("dcgm_diag_warn.json", 0))
    assert v.status == "warn" and "PCIe replay" in v.evidence[0]


@pytest.mark.parametrize(("code", "status"), [(226, "fail"), (205, "fail"), (242, "error"),
                                              (255, "error"), (3, "error")])
def test_dcgm_exit_codes_without_json(code: int, status: str) -> None:
    v = st.parse_dcgm("n", {"exit_code": code, "stdout": "", "stderr": "Error: boom"})
    assert v.status == status
    assert v.details["exit_meaning"] == st.DCGM_EXIT.get(code, f"unexpected dcgmi exit code {code}")


def test_dcgm_skip_and_timeout() -> None:
    assert st.parse_dcgm("n", {"skipped": "dcgmi not found"}).status == "skip"
    assert st.parse_dcgm("n", {"timed_out": True, "seconds": 9}).status == "error"


def test_dcgm_clean_pass() -> None:
    tree = json.loads((DATA / "dcgm_diag_fail.json").read_text())
    tree["DCGM Diagnostic"]["test_categories"] = tree["DCGM Diagnostic"]["test_categories"][:1]
    v = st.parse_dcgm("n", {"exit_code": 0, "stdout": json.dumps(tree)})
    assert v.status == "pass"


def _a2a(status: str = "pass", bw: float | None = 10.0, **kw: Any) -> dict[str, Any]:
    return {"status": status, "busbw_gbps": bw, "backend": "nccl", "timeout": 5, **kw}


def test_alltoall_judge() -> None:
    docs = {"a": _a2a(), "b": _a2a(bw=2.0), "c": _a2a(bw=11.0), "d": _a2a("wrong_data",
            mismatches=["rank 1: element 3"]), "e": _a2a("hang", hung_ranks=[0]),
            "f": {"skipped": "torch is not installed"}, "g": _a2a("error", errors=["rank 0: X"])}
    got = {v.node: v for v in st.judge_alltoall(docs, 0.5)}
    assert {n: v.status for n, v in got.items()} == {
        "a": "pass", "b": "fail", "c": "pass", "d": "fail", "e": "fail", "f": "skip", "g": "fail"}
    assert "below 0.5 x the fleet median" in got["b"].evidence[0]
    # Two measured machines: no median judgement.
    two = st.judge_alltoall({"a": _a2a(bw=10), "b": _a2a(bw=1)}, 0.5)
    assert [v.status for v in two] == ["pass", "pass"]


def _rounds(nodes: list[str], bad: set[str]) -> list[list[tuple[list[str], bool]]]:
    rounds: list[list[tuple[list[str], bool]]] = []
    while groups := st.next_round(nodes, rounds):
        for g in groups:
            assert len(set(g)) == len(g)
        assert len({n for g in groups for n in g}) == sum(len(g) for g in groups)
        rounds.append([(g, not bad & set(g)) for g in groups])
    return rounds


@pytest.mark.parametrize("n", range(2, 17))
def test_pair_rounds_name_every_single_bad_machine(n: int) -> None:
    nodes = [f"m{i}" for i in range(n)]
    for bad in nodes:
        rounds = _rounds(nodes, {bad})
        faulty, ambiguous = st.judge_rounds(nodes, rounds)
        if n == 2:  # two machines that only meet each other cannot be told apart
            assert (faulty, ambiguous) == ([], nodes)
        else:
            assert (faulty, ambiguous) == ([bad], []), (n, bad, rounds)
            assert len(rounds) <= 3


@pytest.mark.parametrize("n", range(4, 11))
def test_pair_rounds_two_bad_machines(n: int) -> None:
    nodes = [f"m{i}" for i in range(n)]
    for pair in itertools.combinations(nodes, 2):
        faulty, _ = st.judge_rounds(nodes, _rounds(nodes, set(pair)))
        assert set(faulty) <= set(pair)  # never blames a good machine
        if n >= 5:
            assert sorted(faulty) == sorted(pair), (n, pair)


@pytest.mark.parametrize("n", range(6, 13))
def test_a_flaky_machine_that_passed_once_never_condemns_a_healthy_partner(n: int) -> None:
    """F passes round 1 and fails from then on; X is bad. F used to be trusted as a
    known-good partner, and a healthy machine failing beside it was named faulty."""
    nodes = [f"m{i}" for i in range(n)]
    for bad, flaky in itertools.permutations(nodes, 2):
        rounds: list[list[tuple[list[str], bool]]] = []
        while groups := st.next_round(nodes, rounds):
            later = bool(rounds)
            rounds.append([(g, bad not in g and not (later and flaky in g)) for g in groups])
        faulty, _ = st.judge_rounds(nodes, rounds)
        assert set(faulty) <= {bad, flaky}, (n, bad, flaky, rounds)
        assert len(rounds) <= 3


def test_a_randomly_flaky_machine_never_gets_a_healthy_one_named() -> None:
    """A flaky machine fails each group with p 0.3-0.7 beside one bad machine. At the end
    one blamer was enough: a machine first tested in round 2 or 3 beside the flaky one
    (it had passed earlier) was named (29 of 20,000; n=5, bad m3, flaky m0 named m4).
    Now a fourth round retests a machine blamed once; a flaky machine may stay undecided."""
    rng = random.Random(15)
    named = 0
    for _ in range(4000):
        n = rng.randint(4, 32)
        nodes = [f"m{i}" for i in range(n)]
        bad, flaky = rng.sample(nodes, 2)
        p = rng.choice([0.3, 0.5, 0.7])
        rounds: list[list[tuple[list[str], bool]]] = []
        while groups := st.next_round(nodes, rounds):
            rounds.append([(g, bad not in g and not (flaky in g and rng.random() < p))
                           for g in groups])
        faulty, _ = st.judge_rounds(nodes, rounds)
        assert set(faulty) <= {bad, flaky}, (n, bad, flaky, rounds)
        assert len(rounds) <= st.MAX_ROUNDS
        named += bad in faulty
    assert named >= 3990  # the bad machine is still named


def test_the_odd_machine_first_tested_beside_a_flaky_one_is_retested() -> None:
    nodes = [f"m{i}" for i in range(5)]
    rounds: list[list[tuple[list[str], bool]]] = []
    while groups := st.next_round(nodes, rounds):  # m0 flaky: fails from round 3 on
        rounds.append([(g, "m3" not in g and not (len(rounds) >= 2 and "m0" in g))
                       for g in groups])
    faulty, _ = st.judge_rounds(nodes, rounds)
    assert faulty == ["m3"], rounds


def _found(name: str, nodes: tuple[str, ...] = ()) -> Any:
    book = next(b for b in BOOKS if b.name == name)
    from brctl.analysis.playbook import Classification, Hit
    return Classification(book, nodes, tuple(Hit(n, "m", "line") for n in nodes))


NOW = 1_000_000.0


def test_decision_flow() -> None:
    # user code: rollback, never evict, whatever the stages or history say
    v = decide(_found("user-code", ("a",)), ["b"], [], now=NOW, window=60)
    assert (v.decision, v.faulty) == ("rollback", ())
    # confident hardware signal
    v = decide(_found("gpu-lost", ("b",)), [], [], now=NOW, window=60)
    assert (v.decision, v.faulty) == ("evict", ("b",))
    # a stage named a machine
    v = decide(_found("nccl", ("a", "b")), ["c"], [], now=NOW, window=60, faulty_stage="alltoall")
    assert (v.decision, v.faulty) == ("evict", ("c",)) and "alltoall" in v.reason
    # all passed: reattempt, then rollback, then replay
    past: list[PastConclusion] = []
    seen = []
    for _ in range(4):
        v = decide(_found("nccl", ("a",)), [], past, now=NOW, window=60)
        seen.append(v.decision)
        past.append(PastConclusion("nccl", v.decision, NOW - 10 + len(past)))
    assert seen == ["reattempt", "rollback", "replay", "replay"]
    # a different symptom, or an old verdict, starts again
    assert decide(_found("nccl"), [], [PastConclusion("oom", "reattempt", NOW - 1)], now=NOW,
                  window=60).decision == "reattempt"
    assert decide(_found("nccl"), [], [PastConclusion("nccl", "reattempt", NOW - 100)], now=NOW,
                  window=60).decision == "reattempt"
    # OOM: rollback when clean
    assert decide(_found("oom", ("a",)), [], [], now=NOW, window=60).decision == "rollback"
    # evict on match but the evidence names nobody (forced symptom): the stages decide
    assert decide(_found("gpu-lost"), [], [], now=NOW, window=60).decision == "reattempt"


@pytest.mark.parametrize(("on_match", "matched", "faulty", "last"), list(itertools.product(
    ["diagnose", "evict", "rollback"], [(), ("a",)], [(), ("b",)],
    [None, "reattempt", "rollback", "replay", "evict"])))
def test_decision_exhaustive(on_match: str, matched: tuple[str, ...], faulty: tuple[str, ...],
                             last: str | None) -> None:
    from brctl.analysis.playbook import Classification, DecisionRules
    book = Playbook(name="x", symptom="x", match=[], decision=DecisionRules(on_match=on_match))  # type: ignore[arg-type]
    past = [PastConclusion("x", last, NOW - 1)] if last else []
    v = decide(Classification(book, matched, ()), faulty, past, now=NOW, window=60)
    if on_match == "rollback" and matched:
        assert v.decision == "rollback" and v.faulty == ()
    elif on_match == "evict" and matched:
        assert v.decision == "evict" and v.faulty == matched
    elif faulty:
        assert v.decision == "evict" and v.faulty == faulty
    else:
        want = {None: "reattempt", "evict": "reattempt", "reattempt": "rollback",
                "rollback": "replay", "replay": "replay"}[last]
        assert v.decision == want and v.faulty == ()
    assert v.decision in ("evict", "reattempt", "rollback", "replay") and v.reason


def _outcome(name: str, tested: tuple[str, ...] = (), skip: tuple[str, ...] = (),
             warned: tuple[str, ...] = ()) -> Any:
    from brctl.analysis.diagnose.decide import StageOutcome
    return StageOutcome(name, tested, warned, skip)


ALL = ("a", "b", "c")
NO_DCGMI = "dcgmi not found on PATH"
NO_TORCH = "torch is not installed on this machine"


def test_every_stage_skipped_is_never_called_clean() -> None:
    stages = [_outcome("eud", skip=(NO_DCGMI,)), _outcome("alltoall", skip=(NO_TORCH,)),
              _outcome("allgather", skip=(NO_TORCH,))]
    v = decide(_found("nccl", ("a",)), [], [], now=NOW, window=60, stages=stages)
    assert "no stage could test anything" in v.reason and "passed" not in v.reason
    assert f"eud: {NO_DCGMI}" in v.reason and f"alltoall: {NO_TORCH}" in v.reason
    assert "not known to be clean" in v.reason and v.faulty == ()
    # the repeat rules still apply, but the reason never claims a pass
    v = decide(_found("nccl", ("a",)), [], [PastConclusion("nccl", "reattempt", NOW - 1)],
               now=NOW, window=60, stages=stages)
    assert v.decision == "rollback" and "passed" not in v.reason


def test_mixed_passed_and_skipped_stages_say_which_ran() -> None:
    stages = [_outcome("eud", skip=(NO_DCGMI,)), _outcome("alltoall", ALL),
              _outcome("allgather", ALL)]
    v = decide(_found("nccl", ("a",)), [], [], now=NOW, window=60, stages=stages)
    assert v.decision == "reattempt"
    assert "alltoall and allgather passed; eud skipped (dcgmi not found on PATH)" in v.reason
    assert "every stage passed" not in v.reason


def test_all_stages_passed_and_warnings() -> None:
    stages = [_outcome("eud", ALL), _outcome("alltoall", ALL)]
    v = decide(_found("nccl", ("a",)), [], [], now=NOW, window=60, stages=stages)
    assert "every stage passed" in v.reason
    stages = [_outcome("eud", ALL, warned=("b",)), _outcome("alltoall", ALL)]
    v = decide(_found("nccl", ("a",)), [], [], now=NOW, window=60, stages=stages)
    assert "eud warned on b" in v.reason and "every stage passed" not in v.reason


def test_a_stage_that_skipped_some_machines_says_so() -> None:
    stages = [_outcome("eud", ("a",), skip=(NO_DCGMI,))]
    v = decide(_found("nccl", ("a",)), [], [], now=NOW, window=60, stages=stages)
    assert "eud passed; eud skipped some machines (dcgmi not found on PATH)" in v.reason


# The whole ladder over fake machines: every probe answers as the real one would.

def _machines(answers: dict[str, Any]) -> Any:
    from brctl.remote.fake import FakeTransport, Reply

    def handle(node: Any, argv: Any, stdin: bytes | None) -> Reply:
        module, _ = probe_call(argv)
        request = json.loads(stdin or b"{}")
        doc = answers[module](node.name, request)
        return Reply(stdout=json.dumps({"schema": "brctl.probe/1", **doc}))

    return FakeTransport(handle)


def _inv(n: int = 3) -> Any:
    from brctl.analysis.inventory import from_document
    return from_document({"nodes": [{"name": f"m[1-{n}]", "connection": "local", "gpus": 2}],
                          "job": {"name": "j", "nodes": f"m[1-{n}]"}}, "inv.yaml")


def _evidence(procs: dict[str, list[dict[str, Any]]] | None = None) -> Any:
    def answer(node: str, request: dict[str, Any]) -> dict[str, Any]:
        return {"logs": {"/log": ["[rank3]: Watchdog caught collective operation timeout"] if node == "m1" else ["ok"]},
                "log_errors": [], "xid_lines": [], "kernel_error": None,
                "processes": (procs or {}).get(node, [])}
    return answer


def _skip(reason: str) -> Any:
    return lambda node, request: {"op": request.get("op"), "skipped": reason}


def test_ladder_with_every_stage_skipped_is_incomplete() -> None:
    from brctl.operations.diagnose import diagnose
    t = _machines({"brctl.diagnostics.evidence": _evidence(),
                   "brctl.diagnostics.dcgm": _skip(NO_DCGMI),
                   "brctl.diagnostics.collective": _skip(NO_TORCH)})
    report = diagnose(_inv(), t, BOOKS)
    assert report.found.playbook.name == "nccl"
    assert [s.name for s in report.stages] == ["eud", "alltoall", "allgather"]
    assert all(s.nodes_tested == () for s in report.stages)
    assert int(report.exit_code) == 3 and report.faulty == ()
    assert set(report.incomplete) == {"m1", "m2", "m3"}
    assert NO_DCGMI in report.incomplete["m2"] and NO_TORCH in report.incomplete["m2"]
    doc = report.to_json()
    assert doc["stages"][0]["skipped"] == [NO_DCGMI]
    assert "no stage could test anything" in doc["reason"] and "passed" not in doc["reason"]


def test_ladder_with_eud_skipped_and_collectives_passing() -> None:
    from brctl.operations.diagnose import diagnose

    def collective(node: str, request: dict[str, Any]) -> dict[str, Any]:
        if request["op"] == "free_port":
            return {"op": "free_port", "port": 1234}
        return {"op": request["op"], "status": "pass", "backend": "gloo", "busbw_gbps": 1.0}

    t = _machines({"brctl.diagnostics.evidence": _evidence(),
                   "brctl.diagnostics.dcgm": _skip(NO_DCGMI),
                   "brctl.diagnostics.collective": collective})
    report = diagnose(_inv(), t, BOOKS)
    assert int(report.exit_code) == 0 and report.decision == "reattempt" and not report.incomplete
    assert "alltoall and allgather passed; eud skipped (dcgmi not found on PATH)" in report.reason


def test_live_training_processes_refuse_unless_forced() -> None:
    from brctl.core.errors import RefusedError
    from brctl.operations.diagnose import Options, diagnose
    answers = {"brctl.diagnostics.evidence": _evidence({"m2": [{"pid": 42, "cmdline": "pretrain"}]}),
               "brctl.diagnostics.dcgm": _skip(NO_DCGMI),
               "brctl.diagnostics.collective": _skip(NO_TORCH)}
    t = _machines(answers)
    with pytest.raises(RefusedError, match="alive on m2") as err:
        diagnose(_inv(), t, BOOKS)
    assert err.value.code == 4
    assert not any(probe_call(c.argv)[0] != "brctl.diagnostics.evidence" for c in t.calls)  # no stage ran
    report = diagnose(_inv(), _machines(answers), BOOKS, Options(force=True))
    assert [s.name for s in report.stages] == ["eud", "alltoall", "allgather"]


@pytest.mark.parametrize(("connection", "judged"), [("ssh", True), ("local", False)])
def test_bandwidth_is_judged_across_real_machines_only(connection: str, judged: bool) -> None:
    from brctl.analysis.inventory import from_document
    from brctl.operations.diagnose import diagnose

    def collective(node: str, request: dict[str, Any]) -> dict[str, Any]:
        if request["op"] == "free_port":
            return {"op": "free_port", "port": 1234}
        bw = 0.01 if node == "m2" else 1.0  # m2 is 100x slower
        return {"op": request["op"], "status": "pass", "backend": "gloo", "busbw_gbps": bw}

    inv = from_document({"nodes": [{"name": "m[1-3]", "connection": connection, "gpus": 2}],
                         "job": {"name": "j", "nodes": "m[1-3]"}}, "inv.yaml")
    t = _machines({"brctl.diagnostics.evidence": _evidence(),
                   "brctl.diagnostics.dcgm": _skip(NO_DCGMI),
                   "brctl.diagnostics.collective": collective})
    report = diagnose(inv, t, BOOKS)
    # local "machines" share one host's CPUs: their speeds say nothing about a machine
    assert report.faulty == (("m2",) if judged else ())


def test_the_cli_refuses_a_diagnosis_beside_live_training_over_a_fake_transport(
        tmp_path: Path, brctl: Any) -> None:
    """The real command, run in-process over a FakeTransport (``brctl(..., transport=)``)."""
    inv = tmp_path / "inv.yaml"
    inv.write_text(json.dumps({"nodes": [{"name": "m[1-3]", "connection": "local", "gpus": 2}],
                               "job": {"name": "j", "nodes": "m[1-3]"}}))
    t = _machines({"brctl.diagnostics.evidence": _evidence({"m2": [{"pid": 42,
                                                                     "cmdline": "pretrain"}]}),
                   "brctl.diagnostics.dcgm": _skip(NO_DCGMI),
                   "brctl.diagnostics.collective": _skip(NO_TORCH)})
    r = brctl("-i", inv, "--json", "diagnose", transport=t)
    assert r.exit_code == 4, r.stderr
    assert r.json["schema"] == "brctl.error/1" and "alive on m2" in r.json["message"]
    assert {probe_call(c.argv)[0] for c in t.calls} == {"brctl.diagnostics.evidence"}
