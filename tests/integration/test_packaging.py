"""The wheel ships playbooks/ and man/ on purpose, and brctl finds them once installed."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# pip must not see the checkout (a PYTHONPATH to it makes brctl look installed already).
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(ROOT)], check=True, timeout=300, env=CLEAN_ENV)
    (path,) = out.glob("brctl-*.whl")
    return path


def test_wheel_contains_data_files(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    data = [n for n in names if ".data/data/share/" in n]
    assert any(n.endswith("share/man/man1/brctl.1") for n in data)
    assert any(n.endswith("share/man/man5/brctl-inventory.5") for n in data)
    shipped = {Path(n).name for n in data if "/share/brctl/playbooks/" in n}
    assert shipped == {p.name for p in (ROOT / "playbooks").glob("*.yaml")}
    examples = {Path(n).name for n in data if "/share/brctl/examples/" in n}
    assert examples == {"local.yaml", "inventory.example.yaml"}  # brctl init writes them


def test_installed_wheel_finds_its_data_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                    "--no-deps", str(wheel)], check=True, timeout=300, env=CLEAN_ENV)
    code = ("from brctl.load.resources import data_dir; import brctl;"
            "print(brctl.__file__); print(data_dir('man')); print(data_dir('playbooks'));"
            "from brctl.load.resources import example; print(example('local.yaml'))")
    proc = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    module, man, playbooks, local = proc.stdout.split()
    assert local == str(venv / "share" / "brctl" / "examples" / "local.yaml")
    assert module.startswith(str(venv)), module
    assert man == str(venv / "share" / "man") and (Path(man) / "man1" / "brctl.1").is_file()
    assert playbooks == str(venv / "share" / "brctl" / "playbooks")


def test_checkout_finds_its_data() -> None:
    from brctl.load.resources import data_dir

    assert data_dir("man") in (ROOT / "man", Path(sys.prefix) / "share" / "man")
