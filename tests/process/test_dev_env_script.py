"""scripts/dev-env asks for torch's CPU build where PyPI's plain wheel is the CUDA one.

The script runs for real in a copy of its folder, with a stand-in venv python that records what
pip was asked for (and can refuse it), and a stand-in `uname` for the platform.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _world(tmp: Path, machine: str, refuse: str = "") -> Path:
    (tmp / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "dev-env", tmp / "scripts" / "dev-env")
    (tmp / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    bin_ = tmp / ".venv" / "bin"
    bin_.mkdir(parents=True)
    python = bin_ / "python"
    python.write_text(f"""#!/bin/sh
echo "$*" >> {tmp}/pip.log
case "$*" in *'{refuse or "@never@"}'*) exit 1;; esac
exit 0
""")
    python.chmod(0o755)
    shims = tmp / "shims"
    shims.mkdir()
    uname = shims / "uname"
    uname.write_text(f"""#!/bin/sh
case "$1" in -s) echo Linux;; -m) echo {machine};; esac
""")
    uname.chmod(0o755)
    return tmp


def _run(tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{tmp / 'shims'}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(tmp / "scripts" / "dev-env")], capture_output=True, text=True,
                          timeout=60, env=env)


@pytest.mark.parametrize("machine,spec", [("x86_64", "torch==2.13.0+cpu"), ("aarch64", "torch==2.13.0")])
def test_torch_comes_first_and_is_the_cpu_build(tmp_path: Path, machine: str, spec: str) -> None:
    tmp = _world(tmp_path, machine)
    r = _run(tmp)
    assert r.returncode == 0, r.stderr
    calls = (tmp / "pip.log").read_text().splitlines()
    installs = [c for c in calls if " install " in f" {c} " and "--upgrade pip" not in c]
    assert installs[0].split()[-1] == spec  # before brctl, so nothing else can pull a CUDA torch
    assert installs[1].endswith("-e .[node,daemon,test]")
    assert (tmp / ".venv" / ".brctl-installed").exists()


def test_no_cpu_build_to_be_had_is_a_clear_error_not_a_cuda_download(tmp_path: Path) -> None:
    tmp = _world(tmp_path, "x86_64", refuse="torch==2.13.0+cpu")
    r = _run(tmp)
    assert r.returncode == 1
    assert "torch==2.13.0+cpu is not on this machine's package sources" in r.stderr
    assert "PIP_EXTRA_INDEX_URL" in r.stderr
    calls = (tmp / "pip.log").read_text()
    assert "torch==2.13.0\n" not in calls and "-e ." not in calls  # no fallback to PyPI's CUDA torch
