"""The CLI contract: exit codes, --json, errors without tracebacks, a light --help."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from brctl.cli.app import build_app
from brctl.cli.hoisting import named_command

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "examples" / "local.yaml"


def write(tmp_path: Path, doc: Any) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_nodes_json_lists_machines_and_groups(brctl: Any) -> None:
    res = brctl("-i", LOCAL, "--json", "nodes")
    assert res.exit_code == 0, res.stderr
    doc = res.json
    assert doc["schema"] == "brctl.nodes/1"
    assert list(doc["nodes"]) == ["local1", "local2", "local3", "local4", "spare1"]
    assert doc["job"]["dp"] == 2 and doc["job"]["world"] == 8
    assert [g["members"] for g in doc["groups"]["pp"]] == [["local1", "local3"]] * 2 + [
        ["local2", "local4"]] * 2


def test_nodes_table_folds_identical_machines(brctl: Any) -> None:
    res = brctl("-i", LOCAL, "nodes", "-w", "local[1-4]")
    assert res.exit_code == 0
    assert "pp groups" in res.stdout and "local[1,3]" in res.stdout


def test_exec_folds_output_and_exit_codes(brctl: Any, tmp_path: Path) -> None:
    inv = write(tmp_path, {"nodes": [
        {"name": "ok[1-3]", "connection": "local", "env": {"RC": "0"}},
        {"name": "bad1", "connection": "local", "env": {"RC": "5"}},
    ]})
    res = brctl("-i", inv, "exec", "--", "sh", "-c", 'echo same; exit "$RC"')
    assert res.exit_code == 1
    assert "ok[1-3] (3) ok" in res.stdout and "bad1 (1) exit 5" in res.stdout
    assert res.stdout.count("same") == 2  # folded: printed once per distinct outcome
    ok = brctl("-i", inv, "--json", "exec", "-w", "ok[1-3]", "true")
    assert ok.exit_code == 0
    assert set(ok.json["nodes"]) == {"ok1", "ok2", "ok3"}
    assert ok.json["nodes"]["ok1"] == {"state": "ok", "exit_code": 0, "stdout": "", "stderr": "",
                                       "seconds": ok.json["nodes"]["ok1"]["seconds"]}


def test_exec_timeout_is_incomplete(brctl: Any, tmp_path: Path) -> None:
    inv = write(tmp_path, {"nodes": [{"name": "n[1-2]", "connection": "local"}]})
    res = brctl("-i", inv, "--json", "exec", "-t", "0.3", "-x", "n2", "sleep", "10")
    assert res.exit_code == 3
    assert res.json["nodes"]["n1"]["state"] == "timeout"
    assert res.json["nodes"]["n1"]["exit_code"] is None


def test_exec_one_argument_is_a_shell_command_line(brctl: Any, tmp_path: Path) -> None:
    inv = write(tmp_path, {"nodes": [{"name": "n1", "connection": "local"}]})
    res = brctl("-i", inv, "--json", "exec", "echo hi | wc -l")
    assert res.exit_code == 0 and res.json["argv"] == ["sh", "-c", "echo hi | wc -l"]
    assert res.json["nodes"]["n1"]["stdout"].strip() == "1"
    res = brctl("-i", inv, "--json", "exec", "--", "echo", "a b", "$HOME;")  # argv: no shell
    assert res.json["nodes"]["n1"]["stdout"] == "a b $HOME;\n"
    res = brctl("-i", inv, "--json", "exec", "--argv", "--", "echo hi | wc -l")
    assert res.exit_code == 1 and res.json["argv"] == ["echo hi | wc -l"]  # no such program


def test_no_inventory_exits_2_with_hint(brctl: Any, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BRCTL_INVENTORY", raising=False)
    res = brctl("nodes")
    assert res.exit_code == 2 and res.stdout == ""
    assert "no inventory" in res.stderr and "hint:" in res.stderr
    assert "Traceback" not in res.stderr


def test_bad_inventory_exits_2_naming_file_and_key(brctl: Any, tmp_path: Path) -> None:
    inv = write(tmp_path, {"nodes": [{"name": "a1", "gpus": -1}]})
    res = brctl("-i", inv, "nodes")
    assert res.exit_code == 2
    assert f"{inv}:2: nodes[0].gpus" in res.stderr and "Traceback" not in res.stderr


def test_bad_node_set_and_unknown_option_exit_2(brctl: Any) -> None:
    assert brctl("-i", LOCAL, "exec", "-w", "local[9", "true").exit_code == 2
    assert brctl("-i", LOCAL, "exec", "-w", "nosuch1", "true").exit_code == 2
    res = brctl("-i", LOCAL, "nodes", "--bogus")
    assert res.exit_code == 2 and "No such option" in res.stderr


def test_version(brctl: Any) -> None:
    import brctl as pkg

    res = brctl("--version")
    assert res.exit_code == 0 and res.stdout.strip() == f"brctl {pkg.__version__}"


def test_internal_error_is_70_without_traceback_unless_debug(brctl: Any, monkeypatch: Any) -> None:
    import brctl.operations.nodes as ops

    def boom(*a: Any, **k: Any) -> None:
        raise ZeroDivisionError("bug")

    monkeypatch.setattr(ops, "describe", boom)
    res = brctl("-i", LOCAL, "nodes")
    assert res.exit_code == 70 and "internal error" in res.stderr and "Traceback" not in res.stderr
    res = brctl("-i", LOCAL, "--debug", "nodes")
    assert res.exit_code == 70 and "Traceback" in res.stderr


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys; from brctl.cli.app import run; run(['--help']);"
        "sys.stderr.write(','.join(sorted(sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    loaded = set(proc.stderr.split(","))
    heavy = {"paramiko", "torch", "yaml", "cryptography", "sqlite3", "pynvml", "prometheus_client",
             "pydantic"}
    assert not loaded & heavy, loaded & heavy
    assert "Usage: brctl" in proc.stdout


def test_running_a_command_imports_only_what_it_uses() -> None:
    """typer reads ``-t 5 -f 2 -- true`` without pydantic (~0.15 s of every start); a run
    without Slurm machines never imports the Slurm transport, one of 5 machines never
    the multiprocessing of sharded fan-outs."""
    code = (
        "import sys; from brctl.cli.app import run;"
        f"code = run(['-i', {str(LOCAL)!r}, '-v', 'exec', '-t', '5', '-f', '2', '--', 'true']);"
        "code += run(['nodes', '-c', 'a[1-9]', '-t', '2.5']);"
        "sys.stderr.write(str(code) + ' ' + ','.join(sorted(sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    rc, _, loaded = proc.stderr.rpartition("\n")[2].partition(" ")
    assert rc == "0", proc.stderr
    modules = set(loaded.split(","))
    assert "brctl.cli.coercion" in modules  # the import list was read
    assert not {m for m in modules if m.startswith(("pydantic", "typer._adapters"))}
    assert not modules & {"brctl.remote.slurm.transport", "multiprocessing"}
    # only the named commands' modules are imported and built (~50 ms of every start)
    assert {m for m in modules if m.startswith("brctl.commands.") and "._" not in m} == {
        "brctl.commands.exec", "brctl.commands.nodes"}


@pytest.mark.parametrize("argv, only", [
    (["exec", "--", "true"], "exec"),
    (["-i", "inv.yaml", "--json", "-vv", "health"], "health"),
    (["-iinv.yaml", "--inventory=x", "stacks"], "stacks"),
    (["--help", "exec"], None),  # the root's help lists every command
    (["--version"], None),
    (["-i"], None),
    ([], None),
])
def test_a_run_names_its_command_before_any_other_option(argv: list[str], only: str | None) -> None:
    assert named_command(argv) == only


@pytest.mark.parametrize("only, commands", [
    ("exec", {"exec"}),
    ("unevict", {"evict", "unevict"}),  # both live in one module
    ("exce", None),  # a typo: the whole tree, so the error can list what exists
    ("completion", None),  # a completion script names every command
    (None, None),
])
def test_build_app_registers_only_the_named_command(only: str | None,
                                                    commands: set[str] | None) -> None:
    import typer.main

    built = set(typer.main.get_command(build_app(only=only)).commands)  # type: ignore[attr-defined]
    assert built == (commands or set(typer.main.get_command(build_app()).commands))
    assert commands is not None or len(built) > 10


def test_a_mistyped_command_still_lists_the_commands(brctl: Any) -> None:
    result = brctl("exce", "--", "true")
    assert result.exit_code == 2, result.stderr
    assert "No such command 'exce'. Did you mean 'exec'?" in result.stderr


def _every_command() -> list[list[str]]:
    """Each command, and each subcommand under its group, as words after ``brctl``."""
    import typer.main

    root: Any = typer.main.get_command(build_app())
    return [[name, *([sub] if sub else [])] for name, cmd in root.commands.items()
            for sub in [None, *getattr(cmd, "commands", {})]]


NOWHERE = "/nonexistent/inventory.yaml"
# Global options before the command (a value that is a command's name too), after it,
# glued, counted; aliases, groups, typos, help, version, '--', unknown options.
FORMS = [
    ["-i", "exec", "exec", "true"], ["-i", "nodes", "exec", "--", "true"],
    ["--inventory", "exec", "nodes"], ["--inventory=exec", "nodes"], ["-iexec", "nodes"],
    ["-i", "--json", "nodes"], ["-i", "--", "nodes"], ["-vv", "-q", "nodes", "-i", NOWHERE],
    ["-vq", "nodes"], ["-qv", "-i", NOWHERE, "nodes"], ["-vi", NOWHERE, "nodes"],
    ["-i", str(LOCAL), "nodes"], ["-i", str(LOCAL), "--json", "nodes", "-c", "a[1-3]"],
    ["nodes", "--json", "-i", str(LOCAL)], ["-i", NOWHERE, "--debug", "--utc", "nodes"],
    ["--json=1", "nodes"], ["--json", "--bogus", "nodes"], ["--version", "nodes"],
    ["nodes", "--version"], ["help"], ["help", "exec"], ["--", "exec"], ["-", "exec"],
    ["exe"], ["EXEC"], ["--json", "exce"], ["--json"], ["-i", NOWHERE], ["-h"], ["--help"],
    [], ["--help", "exec"], ["exec", "--help", "nodes"], ["-i", NOWHERE, "exec"],
    ["-i", NOWHERE, "exec", "-t", "5", "--", "true"], ["exec", "-i", NOWHERE, "true"],
    ["-i", NOWHERE, "unevict", "n1", "--reason", "-v"], ["unevict", "--help"],
    ["completion", "bash"], ["completion", "tcsh"], ["_render_exec"], ["../exec"],
    ["-i", NOWHERE, "daemon", "run", "--for", "1s"], ["ckpt", "bakup"], ["update", "stat"],
]


@pytest.mark.parametrize("argv", [
    *FORMS,
    *(form for words in _every_command() for form in (
        [*words, "--help"], ["-i", NOWHERE, "--json", *words],
        ["-q", *words, "-v", "--bogus", "-i"]))], ids=lambda argv: " ".join(argv) or "-")
def test_a_run_that_builds_one_command_acts_as_the_whole_tree(
        argv: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The same exit code, stdout and stderr as with every command built, for any line."""
    import io
    import re

    import brctl.cli.app as cli
    from brctl.env import Env
    from brctl.render.output import Output

    monkeypatch.chdir(tmp_path)  # no ./inventory.yaml; nothing written where it runs
    monkeypatch.delenv("BRCTL_INVENTORY", raising=False)
    monkeypatch.delenv("_BRCTL_COMPLETE", raising=False)

    def outcome() -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = cli.run(list(argv), env=Env(output=Output(stdout=out, stderr=err)))
        stamp = re.compile(r'"generated_at": "[^"]*"')
        return code, stamp.sub("", out.getvalue()), err.getvalue()

    lazy = outcome()
    monkeypatch.setattr(cli, "named_command", lambda _argv: None)  # the whole tree
    assert lazy == outcome()


def test_commands_never_import_paramiko_or_yaml() -> None:
    # the renderers were commands/_render_*.py before render/ had a folder: still covered
    for path in [*(ROOT / "brctl" / "commands").glob("*.py"), *(ROOT / "brctl" / "render").glob("*.py")]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(("paramiko", "yaml")), f"{path.name} imports {name}"


def test_malformed_known_hosts_is_exit_2_before_any_connection(brctl: Any, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("gpu01 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4f\nthis line is not a host key\n")
    inv = write(tmp_path, {"ssh": {"known_hosts": str(known)},
                           "nodes": [{"name": "gpu01", "address": "192.0.2.1"}]})
    res = brctl("-i", inv, "exec", "true")  # 192.0.2.1 (TEST-NET) is never contacted
    assert res.exit_code == 2, res.stderr
    assert f"{known}:2" in res.stderr and "Traceback" not in res.stderr
