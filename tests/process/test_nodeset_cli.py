"""Node sets as clush users type them, through the real CLI: groups, operators, files, stdin."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

INVENTORY = {
    "nodes": [
        {"name": "gpu[01-04]", "connection": "local", "gpus": 1, "labels": {"rack": "r01"}},
        {"name": "gpu[05-08]", "connection": "local", "gpus": 1, "labels": {"rack": "r02"}},
    ],
    "standby": [{"name": "spare[1-2]", "connection": "local", "gpus": 1}],
    "job": {"name": "t", "nodes": "gpu[01-08]"},
}


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(INVENTORY))
    return path


def members(brctl: Any, inv: Path, *args: str) -> list[str]:
    res = brctl("-i", inv, "--json", "nodes", *args)
    assert res.exit_code == 0, res.stderr
    return list(res.json["nodes"])


@pytest.mark.parametrize(("selection", "expected"), [
    (["-w", "@rack:r02"], "gpu[05-08]"),
    (["-w", "@rack"], "gpu[01-08]"),
    (["-w", "@standby"], "spare[1-2]"),
    (["-w", "@all", "-x", "@job"], "spare[1-2]"),
    (["-w", "@job!@rack:r01"], "gpu[05-08]"),
    (["-w", "@rack:r01&gpu[03-06]"], "gpu[03-04]"),
    (["-w", "@rack:r01^gpu[03-06]"], "gpu[01-02,05-06]"),
    (["-w", "gpu[01-08/3]"], "gpu[01,04,07]"),
])
def test_w_takes_groups_operators_and_steps(brctl: Any, inv: Path, selection: list[str],
                                            expected: str) -> None:
    from brctl.core.nodeset import expand

    assert members(brctl, inv, *selection) == expand(expected)


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("-w", "gpu09", "-w 'gpu09': not in the inventory: gpu09"),
    ("-x", "gpu[08-10]", "-x 'gpu[08-10]': not in the inventory: gpu[09-10]"),
    ("-w", "@rack:r99", "group @rack:r99 is not in the inventory"),
])
def test_unknown_names_are_usage_errors_naming_them(brctl: Any, inv: Path, flag: str, value: str,
                                                    needle: str) -> None:
    res = brctl("-i", inv, "nodes", flag, value)
    assert res.exit_code == 2 and needle in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_w_reads_a_file_and_stdin(brctl: Any, inv: Path, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    listed = tmp_path / "hosts"
    listed.write_text("# drained last night\ngpu02\ngpu[05-06] spare1\n\n")
    assert members(brctl, inv, "-w", f"^{listed}") == ["gpu02", "gpu05", "gpu06", "spare1"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("gpu07\n"))
    assert members(brctl, inv, "-w", "@job", "-x", "-") == [f"gpu0{i}" for i in (1, 2, 3, 4, 5, 6, 8)]
    res = brctl("-i", inv, "nodes", "-w", f"^{tmp_path / 'missing'}")
    assert res.exit_code == 2 and "missing" in res.stderr


def test_nodes_fold_expand_count_need_no_inventory(brctl: Any, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no ./inventory.yaml
    monkeypatch.delenv("BRCTL_INVENTORY", raising=False)
    res = brctl("nodes", "--fold", "gpu3", "gpu1", "gpu2", "gpu[7-9]!gpu8")
    assert (res.exit_code, res.stdout, res.stderr) == (0, "gpu[1-3,7,9]\n", "")
    assert brctl("nodes", "-e", "gpu[1-5/2]").stdout == "gpu1 gpu3 gpu5\n"
    assert brctl("nodes", "-c", "gpu[001-128]", "gpu[129-256]").stdout == "256\n"
    doc = brctl("--json", "nodes", "-f", "a[1-2]").json
    assert doc["schema"] == "brctl.nodes.set/1" and doc["members"] == ["a1", "a2"]
    assert doc["nodeset"] == "a[1-2]" and doc["count"] == 2
    res = brctl("nodes", "-f", "@job")
    assert res.exit_code == 2 and "no inventory" in res.stderr


def test_nodes_fold_resolves_groups_with_an_inventory(brctl: Any, inv: Path) -> None:
    assert brctl("-i", inv, "nodes", "-f", "@rack:r01", "spare2").stdout == "gpu[01-04],spare2\n"
    res = brctl("-i", inv, "nodes", "gpu1")
    assert res.exit_code == 2 and "--fold" in res.stderr


def test_nodes_fold_reads_stdin_as_nodeset_does() -> None:
    run = subprocess.run([sys.executable, "-m", "brctl", "nodes", "-f"], input="n3\nn1 n2\n",
                         capture_output=True, text=True, timeout=120, check=False)
    assert (run.returncode, run.stdout) == (0, "n[1-3]\n"), run.stderr
