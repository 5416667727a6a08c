"""brctl evict/unevict, standby size/list/check, ettr and daemon run/status through the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from brctl.operations.ledger.state import DaemonState
from brctl.state import Store

RECORD = "import json,sys; open(sys.argv[1],'a').write(json.dumps(sys.argv[2:])+'\\n')"


def write_inv(tmp_path: Path, **daemon: Any) -> Path:
    doc = {
        "nodes": [{"name": "n[1-4]", "connection": "local", "gpus": 1}],
        "standby": [{"name": "s1", "connection": "local", "gpus": 1}],
        "job": {"name": "llm", "nodes": "n[1-4]",
                "evict_command": [sys.executable, "-c", RECORD, str(tmp_path / "evict.jsonl"),
                                  "{node}", "{reason}"]},
        "health": {"checks": ["disk"]},
        "daemon": {"max_evictions_per_hour": 1, "metrics_port": 0, **daemon},
    }
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_evict_records_tells_scheduler_and_caps_refuse(brctl: Any, tmp_path: Path,
                                                       state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    res = brctl("-i", inv, "--json", "evict", "n2", "--reason", "xid 79 on GPU3")
    assert res.exit_code == 0, res.stderr
    assert res.json["schema"] == "brctl.evict/2" and res.json["members"] == ["n2"]
    assert res.json["nodes"]["n2"]["changed"] is True
    calls = [json.loads(x) for x in (tmp_path / "evict.jsonl").read_text().splitlines()]
    assert calls == [["n2", "xid 79 on GPU3"]]
    again = brctl("-i", inv, "--json", "evict", "n2", "--reason", "again")
    assert again.exit_code == 0 and again.json["nodes"]["n2"]["changed"] is False
    assert again.json["members"] == []
    refused = brctl("-i", inv, "evict", "n3", "--reason", "flaky")
    assert refused.exit_code == 4 and "max_evictions_per_hour" in refused.stderr
    assert "Traceback" not in refused.stderr
    store = Store(state_dir)
    state = DaemonState(store, "llm")
    assert list(state.quarantined()) == ["n2"]
    assert [a.state for a in state.actions()] == ["done", "refused"]
    store.close()
    # quarantined machines never show as ready standbys; unevict returns them unchecked
    assert brctl("-i", inv, "--json", "unevict", "n2").json["members"] == ["n2"]
    pool = brctl("-i", inv, "--json", "standby", "list").json
    assert pool["ready"] == [] and {n: m["status"] for n, m in pool["nodes"].items()} == {
        "s1": "unchecked"}


def test_evict_errors_exit_2(brctl: Any, tmp_path: Path, state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    res = brctl("-i", inv, "evict", "nope", "--reason", "x")
    assert res.exit_code == 2 and "not in the inventory" in res.stderr and "nope" in res.stderr
    assert brctl("-i", inv, "evict", "n1").exit_code == 2  # --reason is required
    dry = brctl("-i", inv, "--json", "evict", "n1", "--reason", "x", "--dry-run")
    assert dry.exit_code == 0 and dry.json["dry_run"] is True
    assert not (tmp_path / "evict.jsonl").exists()


def test_standby_size_flag_and_history(brctl: Any, tmp_path: Path, state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    res = brctl("-i", inv, "--json", "standby", "size", "--machines", "1000",
                "--daily-failure-rate", "0.002")
    assert res.exit_code == 0 and res.json["schema"] == "brctl.standby.size/1"
    assert res.json["size"] == 6  # P99 of Binomial(1000, 0.002): mean 2
    none = brctl("-i", inv, "standby", "size")
    assert none.exit_code == 2 and "--daily-failure-rate" in none.stderr
    bad = brctl("-i", inv, "standby", "size", "--daily-failure-rate", "2")
    assert bad.exit_code == 2
    brctl("-i", inv, "evict", "n1", "--reason", "ecc")
    hist = brctl("-i", inv, "--json", "standby", "size")
    assert hist.exit_code == 0 and hist.json["source"] == "history" and hist.json["size"] >= 1


def test_standby_check_marks_machines_on_local_nodes(brctl: Any, tmp_path: Path,
                                                     state_dir: Path) -> None:
    inv = write_inv(tmp_path, standby_stages=[])  # health only, said so in the detail
    res = brctl("-i", inv, "--json", "standby", "check")
    assert res.exit_code == 0, res.stderr
    assert res.json["ready"] == ["s1"]
    assert "standby_stages is empty" in res.json["nodes"]["s1"]["detail"]


DCGM_FAIL = Path(__file__).parent.parent / "unit" / "data" / "dcgm_diag_fail.json"


def pool_inv(tmp_path: Path, spares: list[dict[str, Any]]) -> Path:
    path = write_inv(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["standby"] = spares
    path.write_text(yaml.safe_dump(doc))
    return path


def test_standby_check_runs_the_diagnose_stages(brctl: Any, tmp_path: Path,
                                                state_dir: Path) -> None:
    # s2's dcgmi (a fake on its PATH) reports a failed memory test with real dcgmi JSON;
    # s1 has no dcgmi: its EUD skips, and its all-to-all (torch, gloo) decides.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "dcgmi").write_text(f"#!/bin/sh\ncat {DCGM_FAIL}\nexit 226\n")
    (fake / "dcgmi").chmod(0o755)
    py = sys.executable  # the interpreter with torch: the all-to-all can run
    inv = pool_inv(tmp_path, [
        {"name": "s1", "connection": "local", "gpus": 1, "python": py},
        {"name": "s2", "connection": "local", "gpus": 1, "python": py,
         "env": {"PATH": f"{fake}:/usr/bin:/bin"}}])
    res = brctl("-i", inv, "--json", "standby", "check")
    assert res.exit_code == 1, res.stderr
    pool = res.json["nodes"]
    assert pool["s1"]["status"] == "checked" and "alltoall pass" in pool["s1"]["detail"]
    assert "eud skipped (dcgmi not found" in pool["s1"]["detail"]
    assert pool["s2"]["status"] == "failed" and pool["s2"]["detail"].startswith("eud: fail")
    assert res.json["ready"] == ["s1"]


def test_standby_check_with_every_stage_skipped_is_untested(brctl: Any, tmp_path: Path,
                                                            state_dir: Path) -> None:
    # no dcgmi, and an interpreter without torch: nothing proves the machine good
    inv = pool_inv(tmp_path, [{"name": "s1", "connection": "local", "gpus": 1,
                               "env": {"PYTHONPATH": str(tmp_path / "notorch")}}])
    (tmp_path / "notorch").mkdir()
    (tmp_path / "notorch" / "torch.py").write_text("raise ImportError('no torch here')\n")
    res = brctl("-i", inv, "--json", "standby", "check")
    assert res.exit_code == 3, res.stderr
    [machine] = res.json["nodes"].values()
    assert machine["status"] == "untested" and res.json["ready"] == []
    assert "no diagnose stage could run" in machine["detail"]
    listed = brctl("-i", inv, "--json", "standby", "list").json
    assert next(iter(listed["nodes"].values()))["status"] == "untested"
    # progress: the health sweep, then each self-check stage, each hearing s1 finish
    from brctl.load.inventory import load_inventory
    from brctl.operations.standby.ops import standby_check
    from brctl.remote.factory import RoutingTransport
    from brctl.remote.probes import ProbeRunner
    from tests.process.test_progress import StageRecorder

    track = StageRecorder()
    transport = RoutingTransport()
    store = Store(state_dir)
    try:
        standby_check(load_inventory(inv), transport, store, None,
                      runner=ProbeRunner(transport), track=track)
    finally:
        store.close()
        transport.close()
    assert track.names() == ["health", "eud (dcgmi diag -r 2)", "alltoall"] and track.complete()


def test_ettr_and_daemon_status_read_the_database(brctl: Any, tmp_path: Path,
                                                  state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    assert brctl("-i", inv, "ettr").exit_code == 0  # nothing recorded: said, not a finding
    store = Store(state_dir)
    state = DaemonState(store, "llm")
    state.add_interval(0, 3000, True)
    state.add_interval(3000, 3600, False)
    state.event("gpu_fault", ["n3"], {"reason": "ecc"}, 3000)
    store.close()
    res = brctl("-i", inv, "--json", "ettr", "--window", "1200", "--points", "4")
    assert res.exit_code == 0 and res.json["schema"] == "brctl.ettr/1"
    assert abs(res.json["cumulative"] - 3000 / 3600) < 1e-9
    assert abs(res.json["window"] - 0.5) < 1e-9 and len(res.json["series"]) == 4
    assert res.json["lost_seconds"] == {"detection": 0, "diagnosis": 600, "standby": 0,
                                        "restart": 0, "replay": 0, "human": 0}
    human = brctl("-i", inv, "ettr")
    assert "83.3%" in human.stdout and " 100% ┤" in human.stdout and "   0% └┬" in human.stdout
    assert "  diagnosis   10m 00s 100% ███" in human.stdout  # the fault was seen at once
    status = brctl("-i", inv, "--json", "daemon", "status")
    assert status.exit_code == 1 and status.json["running"] is False
    assert status.json["events"][0]["kind"] == "gpu_fault"


def test_daemon_run_needs_a_restart_command_unless_dry_run(brctl: Any, tmp_path: Path,
                                                          state_dir: Path) -> None:
    inv = write_inv(tmp_path, poll_interval=0.2)
    res = brctl("-i", inv, "daemon", "run", "--max-iterations", "1")
    assert res.exit_code == 2 and "restart_command" in res.stderr
    dry = brctl("-i", inv, "--json", "daemon", "run", "--dry-run", "--max-iterations", "2")
    assert dry.exit_code == 0, dry.stderr
    assert dry.json["schema"] == "brctl.daemon.run/1" and dry.json["iterations"] == 2
    assert dry.json["stopped_by"] == "max-iterations"
    # a dry run shows its events on stderr and writes nowhere the live daemon reads
    assert not (state_dir / "daemon-events.jsonl").exists()


def test_demo_inventory_and_unit_file_are_valid() -> None:
    from brctl.load.inventory import load_inventory

    root = Path(__file__).resolve().parents[2]
    inv = load_inventory(root / "examples" / "demo.yaml")
    assert inv.job is not None and inv.job.restart_command and inv.standby == ("spare1", "spare2")
    assert inv.daemon.poll_interval == 1
    # scripts/demo wipes /tmp/brctl-demo: the local example must keep its files elsewhere
    local = load_inventory(root / "examples" / "local.yaml")
    assert not local.update.root.startswith("/tmp/brctl-demo")
    assert inv.update.root.startswith("/tmp/brctl-demo/")
    unit = (root / "contrib" / "brctl-daemon.service").read_text()
    assert "ExecStart=/usr/local/bin/brctl -i /etc/brctl/%i.yaml daemon run" in unit


def test_a_bad_webhook_url_is_refused_at_load_without_echoing_it(brctl: Any, tmp_path: Path) -> None:
    for url in ("http://hooks.example.com:99999/T0KEN", "https:///T0KEN", "ftp://x/T0KEN",
                "http://hooks.example.com/T0KEN with space", "https://hooks.example.com/T0KEN\u00e9",
                "https://h\u00f6oks.example.com/T0KEN", "https://user:T0KEN@hooks.example.com/x",
                "https://hooks..example.com/T0KEN", f"https://{'a' * 64}.example.com/T0KEN"):
        inv = write_inv(tmp_path, notify_webhook=url)
        res = brctl("-i", inv, "daemon", "status")
        assert res.exit_code == 2, (url, res.stderr)
        assert "notify_webhook" in res.stderr and "T0KEN" not in res.stderr + res.stdout, url


def test_good_webhook_urls_pass_the_load_check() -> None:
    from brctl.config.daemon import _webhook

    for url in ("https://hooks.slack.com/services/T0/B0/x", "http://127.0.0.1:8080/hook?a=b",
                "https://xn--hoks-5qa.example.com/p%C3%A9", "http://[::1]:9/x"):
        assert _webhook(url) == url


def test_the_notifier_never_raises(tmp_path: Path) -> None:
    from brctl.operations.jobadapter import Notifier

    # a URL that passed the load check but that urllib refuses to send to
    errors = Notifier("llm", "http://127.0.0.1:1/T0KEN\u2028", None, timeout=2).send(
        "evict", "done", "n1", "r", {})
    assert errors and "T0KEN" not in errors[0] and errors[0].startswith("webhook http://127.0.0.1")
    errors = Notifier("llm", None, ["/nonexistent/notifier", "{kind}"], timeout=2).send(
        "evict", "done", None, "r", {})
    assert errors and "notify_command" in errors[0]


def test_metrics_without_prometheus_client_is_an_input_error(brctl: Any, tmp_path: Path,
                                                             state_dir: Path,
                                                             monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # not installed
    inv = write_inv(tmp_path, poll_interval=0.2, metrics_port=19469)
    res = brctl("-i", inv, "daemon", "run", "--dry-run", "--max-iterations", "1")
    assert res.exit_code == 2, res.stderr
    assert "prometheus_client is not installed" in res.stderr and "Traceback" not in res.stderr


def test_standby_check_dry_run_names_machines_and_stages_and_marks_nothing(
        brctl: Any, tmp_path: Path, state_dir: Path) -> None:
    inv = write_inv(tmp_path)
    res = brctl("-i", inv, "--json", "standby", "check", "--dry-run")
    assert res.exit_code == 0, res.stderr
    assert res.json["would_check"] == ["s1"] and res.json["stages"] == ["health", "eud", "alltoall"]
    human = brctl("-i", inv, "standby", "check", "--dry-run")
    assert "would check s1 with health, eud, alltoall" in human.stdout
    pool = brctl("-i", inv, "--json", "standby", "list").json
    assert pool["nodes"]["s1"]["status"] == "unchecked"  # nothing was marked
