"""Every JSON Schema ``python -m brctl.schemas`` lists is checked against a real document.

One command per document, each output validated by ``tests.conftest.validated`` (which
records the schema's name); a schema no command produced here fails the test, so a
new document cannot ship with a schema nothing ever checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from brctl import schemas
from tests.conftest import VALIDATED, local_release_world
from tests.process.test_output_contract import stacks_save

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "examples" / "local.yaml"


def test_every_shipped_schema_is_validated_against_a_real_document(
        brctl: Any, state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    inv, _ = local_release_world(tmp_path)
    src = str(tmp_path / "src")
    runs: list[list[Any]] = [
        ["nodes", "--no-such-option"], ["nodes"], ["nodes", "-f", "a[1-2]"],
        ["init", "--local", "-o", "made.yaml"],
        ["exec", "-w", "local1", "true"], ["health", "-w", "local1"], ["diagnose"],
        ["stacks", "--from", stacks_save(tmp_path)], ["replay", "--plan-only"],
        ["ckpt", "plan"], ["ckpt", "verify"], ["ckpt", "backup"],
        ["ckpt", "restore", "--to", "spare1", "--for", "local1", "--dry-run"],
        ["update", "push", src, "-V", "v1", "--urgent"], ["update", "push", src, "-V", "v2"],
        ["update", "apply"], ["update", "rollback"], ["update", "status"],
        ["update", "history"], ["update", "push", src, "-V", "v3", "--dry-run"],
        ["daemon", "run", "--max-iterations", "1", "--dry-run", "--no-metrics"],
        ["daemon", "status"], ["daemon", "rearm", "--reason", "test"],
        ["evict", "local1", "--reason", "x", "--dry-run"], ["unevict", "local1", "--dry-run"],
        ["standby", "size", "--machines", "8", "--daily-failure-rate", "0.01", "--window", "24"],
        ["standby", "list"], ["standby", "check"], ["ettr"], ["report", "-o", "r.html"],
        ["simulate", "--days", "1", "--machines", "8"],
    ]
    for args in runs:
        r = brctl("-i", inv, "--json", *args)
        assert r.json["schema"], args  # validated (and recorded) here
    documents = set(schemas.names()) - {"brctl.inventory/1"}  # tests/process/test_output_contract
    assert documents - VALIDATED == set()
