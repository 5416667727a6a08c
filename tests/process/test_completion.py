"""``brctl completion SHELL``: the scripts are valid and complete from the inventory, for real.

The bash test sources the printed script in a real bash and calls its completion
function as bash would on TAB, so it proves the whole path: script → brctl →
typer → the inventory's names and groups.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from brctl.commands._complete import candidates

BIN = Path(sys.executable).parent
INVENTORY = {
    "nodes": [{"name": "gpu[01-03]", "connection": "local", "gpus": 1, "labels": {"rack": "r01"}},
              {"name": "cpu1", "connection": "local", "gpus": 0}],
    "standby": [{"name": "spare1", "connection": "local", "gpus": 1}],
    "job": {"name": "t", "nodes": "gpu[01-03]"},
}


def complete_in_bash(words: list[str], environ: dict[str, str] | None = None) -> list[str]:
    """COMPREPLY after TAB on the last of ``words``, from the script brctl prints."""
    if shutil.which("brctl", path=str(BIN)) is None:
        pytest.skip("no brctl console script beside this Python (not installed with pip)")
    script = subprocess.run([str(BIN / "brctl"), "completion", "bash"], capture_output=True,
                            text=True, check=True, timeout=120).stdout
    quoted = " ".join(f"'{w}'" for w in words)
    line = (f'{script}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; '
            '_brctl_completion brctl; printf "%s\\n" "${COMPREPLY[@]}"')
    env = {k: v for k, v in os.environ.items() if k != "BRCTL_INVENTORY"}
    env.update({"PATH": f"{BIN}:{os.environ['PATH']}", **(environ or {})})
    run = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env,
                         timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    return [w for w in run.stdout.splitlines() if w]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_script_is_valid_for_its_shell(brctl: Any, shell: str, tmp_path: Path) -> None:
    res = brctl("completion", shell)
    assert res.exit_code == 0 and res.stderr == ""
    assert "_BRCTL_COMPLETE" in res.stdout
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed here: the script was printed, not parsed")
    script = tmp_path / f"brctl.{shell}"
    script.write_text(res.stdout)
    check = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True, timeout=60,
                           check=False)
    assert check.returncode == 0, check.stderr


def test_unknown_shell_is_a_usage_error(brctl: Any) -> None:
    res = brctl("completion", "tcsh")
    assert res.exit_code == 2 and "tcsh" in res.stderr


def test_bash_completes_node_names_and_groups_from_the_inventory(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(INVENTORY))
    assert complete_in_bash(["brctl", "-i", str(inv), "exec", "-w", "gp"]) == ["gpu01", "gpu02", "gpu03"]
    assert complete_in_bash(["brctl", "-i", str(inv), "health", "-x", "gpu01,@ra"]) == [
        "gpu01,@rack", "gpu01,@rack:r01"]
    got = complete_in_bash(["brctl", "exec", "-w", "@"], {"BRCTL_INVENTORY": str(inv)})
    assert got == ["@all", "@job", "@standby", "@rack", "@rack:r01"]


def test_bash_completes_subcommands_and_options() -> None:
    assert "completion" in complete_in_bash(["brctl", "comp"])
    assert "--reason" in complete_in_bash(["brctl", "evict", "--re"])


def test_no_inventory_gives_no_names_and_no_error(tmp_path: Path) -> None:
    assert complete_in_bash(["brctl", "-i", str(tmp_path / "missing.yaml"), "exec", "-w", "g"]) == []


def test_candidates_complete_the_last_item_after_an_operator() -> None:
    names, groups = ["a1", "a2", "b1"], ["job", "rack:r1"]
    assert candidates(names, groups, "a") == ["a1", "a2"]
    assert candidates(names, groups, "a1!b") == ["a1!b1"]
    assert candidates(names, groups, "@job&@r") == ["@job&@rack:r1"]


def test_bash_completes_positional_node_sets_and_ckpt_restore_machines(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(INVENTORY))
    head = ["brctl", "-i", str(inv)]
    assert complete_in_bash([*head, "evict", "gp"]) == ["gpu01", "gpu02", "gpu03"]
    assert complete_in_bash([*head, "unevict", "gpu01,sp"]) == ["gpu01,spare1"]
    assert complete_in_bash([*head, "nodes", "-f", "@st"]) == ["@standby"]
    assert complete_in_bash([*head, "nodes", "-c", "gpu01", "cp"]) == ["cpu1"]
    for flag in ("--to", "--for", "--from"):
        assert complete_in_bash([*head, "ckpt", "restore", flag, "sp"]) == ["spare1"], flag
