"""The output contract (README "Use"; brctl(1), EXIT STATUS) against the CLI.

Through ``brctl.cli.app.run`` in-process (the console script's own entry, its streams
captured), and through a real process where the process is what is tested
(``python -m brctl.schemas``; pipes and terminals are in test_rendering_contract.py).

JSON documents: one per run, errors included (brctl.error/1); shipped schemas,
distinct names of one pattern, generated_at and status; global options anywhere.
Every ``r.json`` in the suite is validated against the shipped schema (conftest).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from brctl import schemas
from tests.conftest import local_release_world, validated

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "examples" / "local.yaml"
NAME = re.compile(r"^brctl\.[a-z]+(\.[a-z]+)?/[1-9][0-9]*$")


def test_every_schema_is_valid_and_named_by_the_pattern() -> None:
    names = schemas.names()
    assert len(names) == len(set(names))
    for name in names:
        assert NAME.match(name), name
        schema = schemas.get(name)
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$id"] == name


def test_schemas_module_lists_and_prints() -> None:
    listed = subprocess.run([sys.executable, "-m", "brctl.schemas"], capture_output=True,
                            text=True, check=True).stdout.split()
    assert listed == schemas.names() and "brctl.error/1" in listed
    one = subprocess.run([sys.executable, "-m", "brctl.schemas", "brctl.health/1"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(one)["$id"] == "brctl.health/1"
    missing = subprocess.run([sys.executable, "-m", "brctl.schemas", "brctl.nope/1"],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "no schema" in missing.stderr


@pytest.mark.parametrize("path", ["inventory.example.yaml", "examples/local.yaml",
                                  "examples/demo.yaml"])
def test_shipped_inventories_fit_the_inventory_schema(path: str) -> None:
    doc = yaml.safe_load((ROOT / path).read_text())
    jsonschema.validate(doc, schemas.get("brctl.inventory/1"))


def test_inventory_schema_rejects_what_the_loader_rejects() -> None:
    schema = schemas.get("brctl.inventory/1")
    for bad in ({"nodes": [{"name": "a", "gpuz": 1}]}, {"nodes": [{"name": "a", "gpus": -1}]},
                {"nodes": [{"name": "a"}], "ssh": {"host_key_policy": "yolo"}}, {}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_documents_have_generated_at_and_status(brctl: Any, state_dir: Path) -> None:
    r = brctl("-i", LOCAL, "--json", "exec", "-w", "local1", "--", "true")
    assert r.exit_code == 0
    doc = r.json
    assert doc["schema"] == "brctl.exec/1" and doc["status"] == "ok"
    assert re.match(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$", doc["generated_at"])
    failed = brctl("-i", LOCAL, "--json", "exec", "-w", "local1", "--", "false")
    assert failed.exit_code == 1 and failed.json["status"] == "findings"


def test_nodes_is_a_map_and_machine_lists_are_members(brctl: Any, state_dir: Path) -> None:
    doc = brctl("-i", LOCAL, "--json", "nodes").json
    assert doc["nodes"]["local1"]["gpus"] == 2
    assert doc["job"]["members"] == ["local1", "local2", "local3", "local4"]
    assert all("members" in g for rows in doc["groups"].values() for g in rows)


@pytest.mark.parametrize(("args", "code", "where"), [
    (["nodes", "--no-such-option"], 2, {"file": None}),
    (["-i", "/nonexistent/inv.yaml", "nodes"], 2, {"file": "/nonexistent/inv.yaml"}),
    (["health", "--watch", "0"], 2, {}),
])
def test_errors_are_one_json_document(brctl: Any, state_dir: Path, args: list[str], code: int,
                                      where: dict[str, Any]) -> None:
    r = brctl(*(["-i", LOCAL] if args[0] != "-i" else []), *args, "--json")
    assert r.exit_code == code
    doc = r.json
    assert doc["schema"] == "brctl.error/1" and doc["exit"] == code and doc["status"] == "error"
    assert doc["message"] and doc.items() >= where.items()
    assert r.stdout.count('"schema"') == 1
    assert "brctl: error:" in r.stderr  # people still read stderr


def test_schema_error_names_file_and_key(brctl: Any, state_dir: Path, tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - name: a1\n    gpuz: 2\n")
    doc = brctl("--json", "-i", inv, "nodes").json
    assert (doc["exit"], doc["file"], doc["key"]) == (2, str(inv), "nodes[0].gpuz")


@pytest.mark.parametrize("args", [
    ["nodes", "--json", "-i", str(LOCAL)],
    ["nodes", "-i", str(LOCAL), "--json", "-v"],
    ["--json", "nodes", f"--inventory={LOCAL}"],
    ["exec", "--json", "-w", "local1", "-i", str(LOCAL), "--", "true"],
])
def test_global_options_after_the_subcommand(brctl: Any, state_dir: Path, args: list[str]) -> None:
    r = brctl(*args)
    assert r.exit_code == 0, r.stderr
    assert r.json["schema"] in ("brctl.nodes/1", "brctl.exec/1")


def test_options_after_the_remote_command_belong_to_it(brctl: Any, state_dir: Path) -> None:
    r = brctl("-i", LOCAL, "--json", "exec", "-w", "local1", "--", "echo", "--json", "-v")
    assert r.json["nodes"]["local1"]["stdout"] == "--json -v\n"
    r = brctl("-i", LOCAL, "exec", "-w", "local1", "echo", "-i", "x")
    assert r.exit_code == 0 and "-i x" in r.stdout


def test_watch_json_is_one_compact_document_per_line(brctl: Any, state_dir: Path,
                                                     tmp_path: Path) -> None:
    r = brctl("-i", LOCAL, "health", "-w", "local1", "--watch", "0.01", "--count", "3", "--json",
              env={"HOME": str(tmp_path)})
    lines = r.stdout.splitlines()
    assert len(lines) == 3, r.stdout
    docs = [validated(json.loads(line)) for line in lines]
    assert {d["schema"] for d in docs} == {"brctl.health/1"}
    assert "changes" in docs[1]


def test_quiet_prints_nothing_but_keeps_the_exit_code(brctl: Any, state_dir: Path,
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    r = brctl("-i", LOCAL, "nodes", "-q")
    assert (r.exit_code, r.stdout) == (0, "")
    r = brctl("-i", LOCAL, "exec", "-q", "-w", "local1", "--", "false")
    assert (r.exit_code, r.stdout) == (1, "")
    for args in (["nodes", "-f", "a[1-3]"], ["nodes", "-e", "a[1-3]"], ["nodes", "-c", "a[1-3]"]):
        r = brctl(*args, "-q")
        assert (r.exit_code, r.stdout) == (0, ""), args
    inv, _ = local_release_world(tmp_path)
    r = brctl("-i", inv, "-q", "update", "push", tmp_path / "src", "-V", "v1", "--dry-run")
    assert (r.exit_code, r.stdout) == (0, "")
    monkeypatch.chdir(tmp_path)
    r = brctl("init", "--local", "-q", "-o", "made.yaml")
    assert (r.exit_code, r.stdout) == (0, "") and (tmp_path / "made.yaml").exists()


def stacks_save(tmp_path: Path, detail: str = "py-spy did not finish within 10s") -> Path:
    """A saved ``stacks --save`` directory whose rank 3 could not be dumped (exit 1)."""
    from brctl.operations.stacks import save as stacks_save

    data = ROOT / "tests" / "unit" / "data" / "pyspy_dump.json"
    save = tmp_path / "save"
    for rank in range(4):
        node = save / f"m{rank // 2}"
        node.mkdir(parents=True, exist_ok=True)
        if rank == 3:
            (node / f"{rank}-{100 + rank}.error").write_text(detail + "\n")
        else:
            (node / f"{rank}-{100 + rank}.json").write_text(data.read_text())
    (save / "job.json").write_text(json.dumps({
        "schema": stacks_save.SAVE_SCHEMA, "machines": ["m0", "m1"], "gpus": [2, 2], "tp": 1,
        "pp": 1, "cp": 1, "ep": 1, "order": "tp-cp-ep-dp-pp",
        "rounds": [{"dir": ".", "nodes": {
            f"m{n}": {"state": "ok", "error": None,
                      "ranks": [{"rank": r, "pid": 100 + r} for r in (2 * n, 2 * n + 1)]}
            for n in (0, 1)}}]}))
    return save


@pytest.mark.parametrize(("args", "schema"), [
    (["stacks", "--from", "SAVE"], "brctl.stacks/2"),
    (["-i", str(LOCAL), "daemon", "status"], "brctl.daemon.status/1"),
    (["-i", str(LOCAL), "evict", "local1", "--reason", "x", "--dry-run"], "brctl.evict/2"),
    (["-i", str(LOCAL), "unevict", "local1", "--dry-run"], "brctl.unevict/2"),
    (["-i", str(LOCAL), "ckpt", "plan"], "brctl.ckpt.plan/1"),
    (["-i", str(LOCAL), "replay", "--plan-only"], "brctl.replay/1"),
])
def test_a_document_that_judges_says_its_exit_code_as_status(
        brctl: Any, state_dir: Path, tmp_path: Path, args: list[str], schema: str) -> None:
    from brctl.render.output import STATUS_WORDS

    r = brctl("--json", *[str(stacks_save(tmp_path)) if a == "SAVE" else a for a in args])
    doc = r.json
    assert doc["schema"] == schema
    assert doc.get("status") == STATUS_WORDS[r.exit_code], (r.exit_code, r.stderr)
    assert "status" in schemas.get(schema)["required"]  # the schema says it judges


@pytest.mark.parametrize("args", [["--watch", "0"], ["--watch", "5", "-w", "nosuch[1-2]"],
                                  ["--watch", "5", "--count", "0"]])
def test_an_error_under_watch_json_is_one_compact_line(brctl: Any, state_dir: Path,
                                                       args: list[str]) -> None:
    r = brctl("-i", LOCAL, "--json", "health", *args)
    assert r.exit_code == 2
    assert r.stdout.count("\n") == 1, r.stdout  # NDJSON: a reader takes it line by line
    assert validated(json.loads(r.stdout))["schema"] == "brctl.error/1"


def test_a_duplicate_key_error_names_the_key(brctl: Any, state_dir: Path, tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("ssh:\n  user: root\nnodes:\n  - name: a1\n  - name: a2\n    gpus: 8\n"
                   "    gpus: 4\n")
    doc = brctl("--json", "-i", inv, "nodes").json
    assert (doc["exit"], doc["key"], doc["line"]) == (2, "nodes[1].gpus", 7), doc
    top = tmp_path / "top.yaml"
    top.write_text("nodes: []\nssh: {}\nnodes: []\n")
    assert brctl("--json", "-i", top, "nodes").json["key"] == "nodes"
