"""Modules a probe imports from a checked directory are checked too, before they run (real processes).

``check`` passes a root-owned 0755 ``PYTHONPATH`` entry and the interpreter's
site-packages as directories; a file the job user owns inside them (a partial ``chown
-R``) is still rewritable by it. Such a module, its cached bytecode, an extension
module or a package's ``__init__`` is refused when the probe imports it as root (the
node ``refused``, the file named, its code never run), and allowed once the run is the
job user's (``job.user`` with ``as_job``), as the launch decision allows its files.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brctl.core.transport import Node, NodeState
from brctl.remote.local import LocalTransport
from brctl.remote.probes import ProbeRunner

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
# sysinfo calls platform.python_version(): a planted ``platform`` shadows the stdlib's
# (declared entries come before the interpreter's own paths, as with PYTHONPATH).
PLANT = ("import os\n"
         "open({mark!r}, 'w').write(str(os.getuid()))\n"
         "def python_version():\n"
         "    return 'planted'\n")
# Both ways a probe runs as root: in the bootstrap's own process (the trusted python3)
# and under a configured interpreter (stage 2).
INTERPRETERS = pytest.mark.parametrize("python", ["python3", SYSTEM_PYTHON])


def _probe(module: str = "brctl.diagnostics.sysinfo", request: Any = None, *,
           as_job: bool = False, **kw: Any) -> Any:
    node = Node(name="n", address="n", connection="local", **kw)
    return ProbeRunner(LocalTransport()).run([node], module, request or {}, as_job=as_job,
                                             timeout=120)["n"]


def _entry(base: Path, mark: Path) -> tuple[Path, Path]:
    """A root-owned 0755 entry with a root-owned ``platform.py`` that writes ``mark``."""
    site = base / "site"
    site.mkdir()
    site.chmod(0o755)
    planted = site / "platform.py"
    planted.write_text(PLANT.format(mark=str(mark)))
    planted.chmod(0o644)
    return site, planted


@INTERPRETERS
def test_a_job_owned_module_in_a_root_entry_is_refused_before_it_runs(
        tmp_path: Path, python: str) -> None:
    mark = tmp_path / "ran"
    site, planted = _entry(tmp_path, mark)
    os.chown(planted, NOBODY, NOBODY)
    res = _probe(python=python, env={"PYTHONPATH": str(site)})
    assert res.run.state is NodeState.REFUSED, res
    assert not mark.exists()
    assert f"{planted} is owned by nobody (uid {NOBODY})" in (res.error or ""), res.error
    assert "Traceback" not in res.run.stdout + res.run.stderr

    os.chown(planted, 0, 0)  # everything root's: imported, as PYTHONPATH would
    res = _probe(python=python, env={"PYTHONPATH": str(site)})
    assert res.ok, res
    assert res.document["python"] == "planted" and mark.read_text() == "0"


@INTERPRETERS
def test_job_owned_bytecode_of_a_root_module_is_refused(tmp_path: Path, python: str) -> None:
    mark = tmp_path / "ran"
    site, planted = _entry(tmp_path, mark)
    pyc = Path(importlib.util.cache_from_source(str(planted)))
    py_compile.compile(str(planted), cfile=str(pyc), doraise=True)  # valid: Python would use it
    os.chown(pyc, NOBODY, NOBODY)
    res = _probe(python=python, env={"PYTHONPATH": str(site)})
    assert res.run.state is NodeState.REFUSED, res
    assert not mark.exists()
    assert f"{pyc} is owned by nobody (uid {NOBODY})" in (res.error or ""), res.error

    os.chown(pyc, 0, 0)
    res = _probe(python=python, env={"PYTHONPATH": str(site)})
    assert res.ok and res.document["python"] == "planted" and mark.exists(), res


def test_a_job_owned_package_or_extension_in_the_interpreters_site_packages_is_refused(
        tmp_path: Path) -> None:
    """Not a declared entry: the configured interpreter's own site-packages (``pynvml``,
    which the health probe imports lazily), root's 0755 with a job-owned file inside."""
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    python = str(venv / "bin" / "python")
    mark = tmp_path / "ran"
    package = site / "pynvml"
    package.mkdir()
    init = package / "__init__.py"
    init.write_text(f"open({str(mark)!r}, 'w')\n")
    os.chown(init, NOBODY, NOBODY)
    health = ("brctl.diagnostics.health_probe", {"checks": ["nvml"]})
    res = _probe(*health, python=python)
    assert res.run.state is NodeState.REFUSED, res
    assert not mark.exists() and f"{init} is owned by nobody" in (res.error or ""), res.error

    os.chown(init, 0, 0)
    res = _probe(*health, python=python)
    assert res.ok and mark.exists(), res
    assert res.document["nvml"]["status"] == "error"  # this pynvml has no nvmlInit: it ran

    shutil.rmtree(package)
    ext = site / f"pynvml{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    ext.write_bytes(b"\x7fELF not really")
    os.chown(ext, NOBODY, NOBODY)
    res = _probe(*health, python=python)
    assert res.run.state is NodeState.REFUSED, res
    assert f"{ext} is owned by nobody" in (res.error or ""), res.error


@pytest.fixture
def job_dir() -> Iterator[Path]:
    """A directory the job user (nobody) can reach: not under pytest's 0700 tmp."""
    path = Path(tempfile.mkdtemp(prefix="brctl-job-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_run_as_the_job_user_its_own_module_is_imported_and_anothers_refused(job_dir: Path) -> None:
    """Dropped to ``job.user`` the allowed owners are the launch decision's (root, the
    invoking user, the job user): the job's own file is imported, a colleague's is not."""
    mark = job_dir / "out" / "ran"
    mark.parent.mkdir()
    os.chown(mark.parent, NOBODY, NOBODY)
    site, planted = _entry(job_dir, mark)
    os.chown(planted, NOBODY, NOBODY)
    kw: dict[str, Any] = {"python": SYSTEM_PYTHON, "env": {"PYTHONPATH": str(site)},
                          "job_user": "nobody"}
    res = _probe(as_job=True, **kw)
    assert res.ok, res
    assert res.document["uid"] == NOBODY and res.document["python"] == "planted"
    assert mark.read_text() == str(NOBODY)

    mark.unlink()
    os.chown(planted, 1234, 1234)  # neither root, nor us, nor the job user
    res = _probe(as_job=True, **kw)
    assert res.run.state is NodeState.REFUSED, res
    assert not mark.exists() and f"{planted} is owned by uid 1234" in (res.error or ""), res.error


def test_the_guard_applies_unsafe_owner_chain_walking_each_directory_once(tmp_path: Path) -> None:
    """``ImportGuard.unsafe`` is the rule itself (same answers, same reasons), only faster."""
    from brctl.diagnostics.isolate import ImportGuard
    from brctl.diagnostics.safefs import unsafe_owner_chain

    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "job").mkdir()
    os.chown(site / "job", NOBODY, NOBODY)
    for name in ("root.py", "pkg/__init__.py", "job.py", "wide.py", "job/mod.py"):
        (site / name).write_text("")
    os.chown(site / "job.py", NOBODY, NOBODY)
    (site / "wide.py").chmod(0o666)
    (site / "link.py").symlink_to(site / "job.py")  # a root link to the job's file
    (site / "rootlink.py").symlink_to(site / "root.py")
    guard = ImportGuard((0,))
    names = ["root.py", "pkg/__init__.py", "job.py", "wide.py", "job/mod.py", "link.py",
             "rootlink.py", "missing.py"]
    for _ in range(2):  # the second time from the directories already walked
        got = {n: guard.unsafe(str(site / n)) for n in names}
        assert got == {n: unsafe_owner_chain(str(site / n), (0,), sticky_ok=True) for n in names}
    assert [n for n, why in got.items() if why is None] == ["root.py", "pkg/__init__.py",
                                                            "rootlink.py"]
    assert ImportGuard((0, NOBODY)).unsafe(str(site / "link.py")) is None


def test_the_stdlib_directory_is_not_checked_but_site_packages_below_it_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from brctl.diagnostics.isolate import ImportGuard, module_files

    stdlib = os.path.dirname(os.__file__)
    monkeypatch.setattr(sys, "path", [stdlib, f"{stdlib}/site-packages", "/opt/site"])
    guard = ImportGuard((0,))
    assert guard.stdlib(f"{stdlib}/json/__init__.py") and guard.stdlib(f"{stdlib}/os.py")
    assert not guard.stdlib(f"{stdlib}/site-packages/pynvml.py")
    assert not guard.stdlib("/opt/site/json.py") and not guard.stdlib("/elsewhere/x.py")
    spec = importlib.util.find_spec("json")
    assert spec is not None and module_files(spec)[0] == spec.origin
    builtin = importlib.util.find_spec("sys")
    assert builtin is not None and module_files(builtin) == []
