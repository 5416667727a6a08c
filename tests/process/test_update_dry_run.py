"""``update push --urgent|apply|rollback --dry-run`` on ``connection: local`` machines:
the preview names the release and the restart argv, and nothing changes anywhere
(state directory bytes, the machines' release trees, the restart hook's marker)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def tree(*roots: Path) -> dict[str, str]:
    """Every file and link under ``roots``: its bytes' hash, or where the link points."""
    out: dict[str, str] = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_symlink():
                out[str(p)] = f"-> {p.readlink()}"
            elif p.is_file():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_dry_runs_preview_and_change_nothing(brctl: Any, state_dir: Path, tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    marker = tmp_path / "restarted"
    doc["update"] = {"root": str(tmp_path / "nodes" / "{node}")}
    doc["job"]["restart_command"] = ["sh", "-c", f"echo {{version}} >> {marker}", "{version}"]
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc))
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print(1)\n")
    assert brctl("-i", inv, "update", "push", src, "-V", "v1", "--urgent").exit_code == 0
    (src / "train.py").write_text("print(2)\n")
    assert brctl("-i", inv, "update", "push", src, "-V", "v2", "--urgent").exit_code == 0
    before = tree(state_dir, tmp_path / "nodes", marker)

    res = brctl("-i", inv, "--json", "update", "push", src, "-V", "v3", "--urgent", "--dry-run")
    assert res.exit_code == 0, res.stderr
    assert res.json["schema"] == "brctl.update.preview/1" and res.json["action"] == "push"
    assert res.json["version"] == "v3" and res.json["from_version"] == "v2"
    assert res.json["members"] == ["local1", "local2", "local3", "local4"]
    assert res.json["restart"][-1] == "v3"
    text = brctl("-i", inv, "update", "rollback", "--restart", "--dry-run")
    assert text.exit_code == 0 and "from v2 to v1" in text.stdout, text.stdout
    assert "restarted' v1\nnothing was changed.\n" in text.stdout
    apply = brctl("-i", inv, "--json", "update", "apply", "--dry-run")
    assert apply.exit_code == 0 and apply.json["version"] == "v2"

    assert tree(state_dir, tmp_path / "nodes", marker) == before
    assert not any((tmp_path / "nodes").glob("*/releases/v3"))
    assert marker.read_text() == "v1\nv2\n"
