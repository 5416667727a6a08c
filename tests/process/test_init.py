"""``brctl init``: a working local inventory from what brctl ships, and the no-inventory hint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def bare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BRCTL_INVENTORY", raising=False)
    return tmp_path


def test_the_hint_points_at_init_which_writes_a_working_inventory(brctl: Any, bare: Path,
                                                                   state_dir: Path) -> None:
    none = brctl("nodes")
    assert none.exit_code == 2 and "brctl init --local" in none.stderr
    assert "examples/local.yaml" not in none.stderr
    made = brctl("init", "--local")
    assert made.exit_code == 0 and (bare / "inventory.yaml").is_file(), made.stderr
    nodes = brctl("--json", "nodes")
    assert nodes.exit_code == 0 and list(nodes.json["nodes"])[:4] == [f"local{i}" for i in range(1, 5)]
    ran = brctl("--json", "exec", "-w", "@job", "--", "echo", "hi")
    assert ran.exit_code == 0 and {n["stdout"] for n in ran.json["nodes"].values()} == {"hi\n"}


def test_init_keeps_an_existing_file_unless_forced(brctl: Any, bare: Path) -> None:
    (bare / "inventory.yaml").write_text("mine\n")
    kept = brctl("init", "--local")
    assert kept.exit_code == 2 and "exists" in kept.stderr
    assert (bare / "inventory.yaml").read_text() == "mine\n"
    ref = brctl("--json", "init", "--example", "-o", "ref.yaml")
    assert ref.exit_code == 0 and ref.json["example"] == "inventory.example.yaml"
    assert "ssh:" in (bare / "ref.yaml").read_text()
    assert brctl("init", "--local", "--force").exit_code == 0
    assert "connection: local" in (bare / "inventory.yaml").read_text()
    assert brctl("init").exit_code == 2
