"""brctl exec speaks ssh: argument count decides shell vs argv; -s, -L, -w -, streams apart."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml


def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"nodes": [
        {"name": "n[1-3]", "connection": "local"},
    ]}))
    return path


def feed(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_remote_stderr_stays_on_stderr(brctl: Any, tmp_path: Path) -> None:
    r = brctl("-i", inventory(tmp_path), "exec", "echo out; echo err >&2")
    assert r.exit_code == 0
    assert "out" in r.stdout and "err" not in r.stdout
    assert r.stderr == "n[1-3]: err\n"  # only the nodes' stderr: no summary on success


def test_stdin_goes_to_every_node(brctl: Any, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    feed(monkeypatch, b"line one\nline two\n")
    r = brctl("-i", inventory(tmp_path), "--json", "exec", "-s", "wc -l")
    assert {n: d["stdout"].strip() for n, d in r.json["nodes"].items()} == {
        "n1": "2", "n2": "2", "n3": "2"}


def test_nodeset_from_stdin_and_not_with_s(brctl: Any, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    feed(monkeypatch, b"n1\nn3\n")
    r = brctl("-i", inventory(tmp_path), "--json", "exec", "-w", "-", "true")
    assert sorted(r.json["nodes"]) == ["n1", "n3"]
    feed(monkeypatch, b"n1\n")
    r = brctl("-i", inventory(tmp_path), "exec", "-w", "-", "-s", "cat")
    assert r.exit_code == 2 and "-s/--stdin and -w -" in r.stderr


def test_lines_mode_prints_node_colon_line(brctl: Any, tmp_path: Path) -> None:
    r = brctl("-i", inventory(tmp_path), "exec", "-L", "echo a; echo b; echo e >&2")
    assert r.stdout.splitlines() == ["n1: a", "n1: b", "n2: a", "n2: b", "n3: a", "n3: b"]
    assert r.stderr.splitlines() == ["n1: e", "n2: e", "n3: e"]


def test_help_shows_both_forms(brctl: Any) -> None:
    r = brctl("exec", "--help")
    assert "'nvidia-smi -L | wc -l'" in r.stdout and "-- nvidia-smi -L" in r.stdout
    assert "sh -c ARG" in r.stdout


def test_empty_command_is_a_usage_error(brctl: Any, tmp_path: Path) -> None:
    r = brctl("-i", inventory(tmp_path), "exec", "  ")
    assert r.exit_code == 2 and "empty command" in r.stderr
