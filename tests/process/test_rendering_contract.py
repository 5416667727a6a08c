"""One rendering contract, against the real CLI process (README "Use").

Through a pipe nothing is cut or wrapped (one record per line, full text), whatever
$COLUMNS says; through an 80-column pseudo-terminal everything fits, long reasons
wrap under their row and anything cut ends in '…'. Times have a date and a zone.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from brctl.operations.ledger.state import DaemonState
from brctl.state import Store
from tests.conftest import local_release_world

LOCAL = Path(__file__).resolve().parents[2] / "examples" / "local.yaml"

LONG = ("NCCL watchdog timeout on rank 17 after 600 s in all-reduce of the data-parallel "
        "group while the job was saving checkpoint step 41200; the kernel log of n3 shows "
        "Xid 79 (GPU has fallen off the bus) three seconds earlier, so the machine is the cause")
STAMP = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(Z|[+-]\d{2}:\d{2})")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture
def records(tmp_path: Path) -> tuple[Path, Path]:
    """An inventory and a state directory holding what a daemon wrote last week and now."""
    inv = tmp_path / "inv.yaml"
    names = ",".join(f"n{i}" for i in range(1, 41))
    inv.write_text(yaml.safe_dump({
        "nodes": [{"name": "n[1-40]", "connection": "local", "gpus": 1}],
        "job": {"name": "llm", "nodes": "n[1-40]"}}))
    state = tmp_path / "state"
    store = Store(state)
    db = DaemonState(store, "llm")
    now = time.time()
    db.event("gpu_fault", ["n3"], {"reason": "ecc: GPU1: 2 volatile uncorrectable ECC errors"},
             now - 7 * 86400)
    db.event("decision", names.split(","), {"plan": {"decision": "evict", "evict": ["n3"],
                                                     "reason": LONG}}, now - 60)
    db.intend("llm/plan/1", "plan", None, {"plan": {"decision": "evict", "evict": ["n3"],
                                                    "reason": LONG}}, "evict n3", now - 60)
    db.intend("llm/restore/1", "restore", "n3", {}, "restore n3", now - 50)
    db.finish("llm/restore/1", "done", now - 40,
              reason="no backup of n3 yet: no complete backup step on n4")
    store.close()
    return inv, state


def cli(inv: Path, state: Path, *args: str, columns: int = 40,
        ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BRCTL_STATE": str(state), "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "brctl", "-i", str(inv), *args],
                          capture_output=True, text=True, env=env, timeout=120)


def on_a_terminal(inv: Path, state: Path, *args: str, columns: int = 80) -> list[str]:
    """What brctl prints on a pseudo-terminal of ``columns`` columns, line by line."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**os.environ, "BRCTL_STATE": str(state), "TERM": "xterm"}
    env.pop("COLUMNS", None)
    proc = subprocess.Popen([sys.executable, "-m", "brctl", "-i", str(inv), *args],
                            stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(master)
    text = ANSI.sub("", b"".join(chunks).decode())
    return text.replace("\r\n", "\n").splitlines()


def test_through_a_pipe_nothing_is_cut_or_wrapped(records: tuple[Path, Path]) -> None:
    r = cli(*records, "daemon", "status")
    assert r.returncode == 1, r.stderr  # no daemon holds the lease
    lines = r.stdout.splitlines()
    decision = [line for line in lines if " decision " in line]
    assert len(decision) == 1 and decision[0].endswith(f"evict n3: {LONG}")  # one line, in full
    assert "n[1-40]" in decision[0]  # node lists folded
    assert "…" not in r.stdout
    assert any("restore" in line and "skipped: no backup" in line for line in lines)
    assert any(line.rstrip().endswith(f"evict n3: {LONG}") and " plan " in line for line in lines)
    assert all(STAMP.search(line) for line in lines if "gpu_fault" in line or "decision" in line)


def test_on_an_80_column_terminal_everything_fits(records: tuple[Path, Path]) -> None:
    lines = on_a_terminal(*records, "daemon", "status")
    assert lines and all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]
    text = " ".join(line.strip() for line in lines)
    assert re.sub(r"\s+", " ", LONG) in re.sub(r"\s+", " ", text)  # wrapped, not cut
    assert any("skipped: no backup" in line for line in lines)


def test_utc_and_filters(records: tuple[Path, Path]) -> None:
    r = cli(*records, "daemon", "status", "--utc")
    stamps = [m.group(0) for m in STAMP.finditer(r.stdout)]
    assert stamps and all(s.endswith("Z") for s in stamps)
    recent = cli(*records, "daemon", "status", "--since", "1d")
    assert "gpu_fault" not in recent.stdout and "decision" in recent.stdout
    kinds = cli(*records, "--json", "daemon", "status", "--kind", "gpu_fault")
    assert '"kind": "decision"' not in kinds.stdout and '"kind": "gpu_fault"' in kinds.stdout
    node = cli(*records, "daemon", "status", "--node", "n3", "--kind", "restore")
    assert "skipped: no backup" in node.stdout and "decision" not in node.stdout
    bad = cli(*records, "daemon", "status", "--since", "yesterday")
    assert bad.returncode == 2 and "--since yesterday" in bad.stderr


def test_tables_are_whole_through_a_pipe_and_fit_a_terminal(tmp_path: Path) -> None:
    label = "a-failure-domain-label-that-is-much-longer-than-forty-columns-" + "x" * 60
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [
        {"name": "gpu[001-004,007]", "connection": "local", "gpus": 1, "labels": {"rack": label}},
        {"name": "cpu1", "connection": "local", "gpus": 0}]}))
    piped = cli(inv, tmp_path / "state", "nodes")
    assert piped.returncode == 0 and f"rack={label}" in piped.stdout and "…" not in piped.stdout
    assert "gpu[001-004,007]" in piped.stdout  # node lists folded
    lines = on_a_terminal(inv, tmp_path / "state", "nodes")
    assert lines and all(len(line) <= 80 for line in lines), lines


def test_follow_prints_new_records_as_they_are_written(records: tuple[Path, Path]) -> None:
    import signal

    inv, state = records
    doc = yaml.safe_load(inv.read_text())
    doc["daemon"] = {"poll_interval": 0.2}
    inv.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "BRCTL_STATE": str(state)}
    proc = subprocess.Popen([sys.executable, "-m", "brctl", "-i", str(inv), "daemon", "status",
                             "--follow", "--kind", "restart"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # the header: the follow loop has started
    assert first.startswith("job llm:")
    store = Store(state)
    DaemonState(store, "llm").event("restart", ["n1", "n2"], {"reason": "restarted after evict"},
                                    time.time())
    store.close()
    line = proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert "restart" in line and "n[1-2]" in line and line.rstrip().endswith("restarted after evict")


def test_follow_json_is_one_compact_document_per_line_and_only_when_new(
        records: tuple[Path, Path], brctl: Any) -> None:
    """Run in-process, its waits counted instead of slept: 15 polls find nothing new and
    print nothing, the 16th finds the new record, the 17th wait is interrupted (^C)."""
    import json

    inv, state = records
    doc = yaml.safe_load(inv.read_text())
    doc["daemon"] = {"poll_interval": 0.1}
    inv.write_text(yaml.safe_dump(doc))
    waits: list[float] = []

    def poll_later(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 16:  # the daemon writes while status waits
            store = Store(state)
            DaemonState(store, "llm").event("restart", ["n1"], {"reason": "restarted"}, time.time())
            store.close()
        elif len(waits) == 17:
            raise KeyboardInterrupt

    r = brctl("-i", inv, "--json", "daemon", "status", "--follow",
              env={"BRCTL_STATE": str(state)}, sleep=poll_later)
    assert r.exit_code == 130 and waits == [0.1] * 17, r.stderr
    first, second = (json.loads(line) for line in r.stdout.splitlines()[:2])
    assert first["schema"] == "brctl.daemon.status/1" and first["events"]  # the whole status
    assert [e["kind"] for e in second["events"]] == ["restart"] and second["actions"] == []
    assert len(r.stdout.splitlines()) == 2, r.stdout  # nothing for the 15 polls before


def test_exec_output_through_a_pipe_is_the_nodes_bytes(tmp_path: Path) -> None:
    local = LOCAL
    cmd = r"printf 'a\tb  c\\\n' ; printf 'e\tf\n' >&2"
    for extra in ([], ["-L"]):
        r = cli(local, tmp_path / "state", "exec", *extra, "-w", "local1", cmd)
        assert r.returncode == 0, r.stderr
        assert r.stdout.endswith("a\tb  c\\\n"), repr(r.stdout)  # tabs kept, nothing doubled
        assert r.stderr == "local1: e\tf\n", repr(r.stderr)
    assert cli(local, tmp_path / "state", "exec", "-L", "-w", "local1", cmd).stdout == \
        "local1: a\tb  c\\\n"


def test_machine_lists_are_folded_through_a_pipe(tmp_path: Path) -> None:
    import io

    from brctl.core.nodeset import expand, fold_in_order
    from brctl.operations.daemon.report import DaemonReport
    from brctl.render.daemon import render_run
    from brctl.render.output import Output

    # a rank layout keeps its order, folded by runs; expand reads it back alike
    order = ["n3", "n4", "n5", "n1", "gpu009", "gpu010", "x"]
    assert fold_in_order(order) == "n[3-5],n1,gpu[009-010],x"
    assert expand(fold_in_order(order)) == order
    names = [f"n{i}" for i in range(1, 41)]
    out = Output(stdout=io.StringIO())
    render_run(out, DaemonReport("llm", members=names, stopped_by="signal"))
    assert "machines now n[1-40];" in out.stdout.getvalue()
    inv = tmp_path / "inv.yaml"  # one replay group of 20 one-GPU machines per round
    inv.write_text(yaml.safe_dump({
        "nodes": [{"name": "n[1-40]", "connection": "local", "gpus": 1}],
        "job": {"name": "llm", "nodes": "n[1-40]", "tp": 20}}))
    r = cli(inv, tmp_path / "state", "replay", "--plan-only")
    assert r.returncode == 0, r.stderr
    assert "n[1-20]" in r.stdout and "n[21-40]" in r.stdout, r.stdout


def test_update_history_through_a_pipe_keeps_every_date_whole(tmp_path: Path) -> None:
    inv, _ = local_release_world(tmp_path)
    assert cli(inv, tmp_path / "state", "update", "push", str(tmp_path / "src"), "-V", "v1",
               "--urgent").returncode == 0
    r = cli(inv, tmp_path / "state", "update", "history")  # COLUMNS=40: ignored in a pipe
    rows = [line for line in r.stdout.splitlines() if "local[1-4]" in line]
    assert r.returncode == 0 and len(rows) == 2, r.stdout
    assert all(STAMP.match(row) for row in rows) and "…" not in r.stdout, r.stdout


def test_the_diagnose_tree_through_a_pipe_is_whole_even_with_columns_200(
        tmp_path: Path) -> None:
    r = cli(LOCAL, tmp_path / "state", "diagnose", columns=200)
    assert r.returncode == 3, r.stderr  # no stage could run here: no verdict
    lines = r.stdout.splitlines()
    assert "…" not in r.stdout
    verdicts = [line for line in lines if "no verdict local1:" in line]
    assert len(verdicts) == 1 and len(verdicts[0]) > 200  # one line, not wrapped at 200
    assert verdicts[0].endswith(")")  # the whole reason, to its closing parenthesis


@pytest.mark.parametrize(("args", "whole"), [
    (["health"], "no training process on any job machine (job not running?)"),
    (["exec", "-w", "local[1-2]", "echo " + "word " * 40], " ".join(["word"] * 40)),
    (["standby", "list"], "never checked"),
])
def test_health_exec_and_standby_fit_an_80_column_terminal(tmp_path: Path, args: list[str],
                                                           whole: str) -> None:
    lines = on_a_terminal(LOCAL, tmp_path / "state", *args)
    assert lines and all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]
    text = re.sub(r"\s+", " ", " ".join(line.strip() for line in lines))
    assert whole in text, lines  # wrapped to fit, never cut


def test_a_long_outlier_detail_is_a_paragraph_under_its_row(tmp_path: Path) -> None:
    from tests.process.test_output_contract import stacks_save

    save = stacks_save(tmp_path, detail=LONG)
    lines = on_a_terminal(LOCAL, tmp_path / "state", "stacks", "--from", str(save))
    assert lines and all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]
    at = next(i for i, line in enumerate(lines) if "m1  rank 3" in line)
    assert "m1" in lines[at] and "undumpable" in lines[at]
    under = re.sub(r"\s+", " ", " ".join(line.strip() for line in lines[at + 1:]))
    assert LONG in under  # the whole reason, wrapped under its row
    piped = cli(LOCAL, tmp_path / "state", "stacks", "--from", str(save))
    assert any("undumpable" in line and line.endswith(LONG) for line in piped.stdout.splitlines())


def test_a_long_replay_note_is_a_paragraph_under_its_group(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "m[1-4]", "connection": "local",
                                              "gpus": 2}], "job": {"nodes": "m[1-4]", "pp": 2}}))
    failing = f"sh -c 'echo \"$0\" >&2; exit 1' '{LONG}'"  # each group fails: a long note
    lines = on_a_terminal(inv, tmp_path / "state", "replay", "--command", failing,
                          "--timeout", "60")
    assert lines and all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]
    text = re.sub(r"\s+", " ", " ".join(line.strip() for line in lines))
    assert f"m1: exit 1: {LONG}" in text, lines  # wrapped whole, not cut
    piped = cli(inv, tmp_path / "state", "replay", "--command", failing, "--timeout", "60")
    assert any(line.endswith(f"m1: exit 1: {LONG}") for line in piped.stdout.splitlines())


def test_daemon_status_with_nothing_recorded_says_dash_not_none(tmp_path: Path) -> None:
    r = cli(LOCAL, tmp_path / "state", "daemon", "status")
    assert r.returncode == 1 and r.stdout.startswith("job demo: daemon not running"), r.stdout
    assert "None" not in r.stdout and "step -;" in r.stdout, r.stdout
