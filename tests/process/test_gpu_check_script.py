"""scripts/gpu-check without a GPU (as CI runs it), its usage errors, and its wheel list.

The stages themselves are read end to end on CPU stand-ins in
tests/integration/test_gpu_check.py.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check"


def _run(*args: str, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), "--out", str(tmp / "out"), *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **env})


@pytest.mark.parametrize("args", [(), ("--stage", "3")])
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path: Path, args: tuple[str, ...]) -> None:
    r = _run(*args, tmp=tmp_path, GPU_CHECK_TEST_GPUS="0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "gpu-check: no NVIDIA GPU on this machine (nvidia-smi lists none): nothing to check"]
    assert r.stderr == ""
    assert not (tmp_path / "out").exists()  # nothing built, nothing written


@pytest.mark.parametrize("args,message", [
    (("--stage", "7"), "--stage 7: expected a stage number from 1 to 6"),
    (("--stage",), "--stage needs a value"),
    (("--frobnicate",), "unknown argument: --frobnicate"),
    (("--python", "/nonexistent/python3"), "--python /nonexistent/python3: no such interpreter"),
])
def test_bad_arguments_are_usage_errors(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    r = _run(*args, tmp=tmp_path, GPU_CHECK_TEST_GPUS="1")
    assert r.returncode == 2
    assert f"gpu-check: {message}" in r.stderr
    assert "Traceback" not in r.stderr


def test_help_lists_every_option(tmp_path: Path) -> None:
    r = _run("--help", tmp=tmp_path)
    assert r.returncode == 0
    for option in ("--stage", "--out", "--python", "--venv", "--wheels", "--fetch-wheels"):
        assert option in r.stdout


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~; \[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_wheels_cover_brctls_dependencies() -> None:
    """The wheel list is pyproject's dependencies and node extra, torch aside (the machine's)."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in project["dependencies"] + project["optional-dependencies"]["node"]}
    text = SCRIPT.read_text()
    listed = re.search(r"^REQUIREMENTS=\((.*?)\)", text, re.S | re.M)
    assert listed is not None
    have = {_name(r) for r in re.findall(r'"([^"]+)"', listed.group(1))}
    assert wanted - {"torch"} <= have, wanted - have
    assert "torch" not in have  # never a multi-GB CUDA download: the machine's own torch
