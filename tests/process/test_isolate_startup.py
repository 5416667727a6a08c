"""Code a probe runs before or beside its own process is held to the import rule too (real processes).

- Collective workers (one Python process per GPU) start isolated (``-I``) with the
  probe's import paths, its ``ImportGuard`` and its declared entries' ``sitecustomize``:
  a job-owned module only a worker imports (``torch.distributed``) refuses the node
  instead of running as root, and the node's ``PYTHON*`` environment (a user site) is
  not the workers'.
- A ``.pth`` file's import line (``distutils-precedence.pth``: ``__import__('_distutils_hack')``)
  runs once the guard is in place (interpreters start with ``-S``, ``site`` runs after
  the guard), for the configured interpreter and the bootstrap's ``python3`` alike.
- The bootstrap's fallback to an installed brctl imports it only if its whole package
  passes the rule; else it asks for the zip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import brctl
from brctl.core.transport import Node, NodeState
from brctl.remote.local import LocalTransport
from brctl.remote.probes import ProbeRunner

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
INTERPRETERS = pytest.mark.parametrize("python", ["python3", SYSTEM_PYTHON])
MARK = "import os\nopen({mark!r}, 'a').write(str(os.getuid()) + ' ')\n"


def _runner_probe(module: str, request: Any = None, runner: ProbeRunner | None = None,
                  **kw: Any) -> Any:
    node = Node(name="n", address="n", connection="local", **kw)
    runner = runner or ProbeRunner(LocalTransport())
    return runner.run([node], module, request or {}, timeout=240)["n"]


def _dir(path: Path) -> Path:
    path.mkdir(parents=True)
    path.chmod(0o755)
    return path


def _write(path: Path, text: str, owner: int = 0) -> Path:
    path.write_text(text)
    path.chmod(0o644)
    os.chown(path, owner, owner)
    return path


ALLTOALL = {"op": "alltoall", "world": 2, "bytes": 4096, "iterations": 1, "timeout": 60,
            "startup_timeout": 200}


def _fake_torch(site: Path, mark: Path, owner: int) -> Path:
    """A ``torch`` whose ``__init__`` is root's and whose ``distributed`` (imported only by
    the workers, never by the probe itself) belongs to ``owner`` and writes ``mark``."""
    package = _dir(site / "torch")
    _write(package / "__init__.py", "")
    return _write(package / "distributed.py", MARK.format(mark=str(mark)), owner)


@INTERPRETERS
def test_a_job_owned_module_only_the_workers_import_refuses_the_node(
        tmp_path: Path, python: str) -> None:
    mark = tmp_path / "ran"
    site = _dir(tmp_path / "site")
    planted = _fake_torch(site, mark, NOBODY)
    res = _runner_probe("brctl.diagnostics.collective", ALLTOALL, python=python,
                        env={"PYTHONPATH": str(site)})
    assert not mark.exists(), f"ran as uid {mark.read_text()}"
    assert res.run.state is NodeState.REFUSED, res
    assert f"{planted} is owned by nobody (uid {NOBODY})" in (res.error or ""), res.error

    os.chown(planted, 0, 0)  # root's: the workers import it (and fail on this fake torch)
    res = _runner_probe("brctl.diagnostics.collective", ALLTOALL, python=python,
                        env={"PYTHONPATH": str(site)})
    assert res.ok and res.document["status"] == "error", res
    # (a worker that fails first stops its peer, which may not have got that far)
    assert set(mark.read_text().split()) == {"0"}


@INTERPRETERS
def test_workers_ignore_the_nodes_python_environment(tmp_path: Path, python: str) -> None:
    """A user site named by ``PYTHONUSERBASE`` (the node's environment, not its declared
    entries) is the workers' no more than the probe's: isolated (``-I``)."""
    mark = tmp_path / "ran"
    site = _dir(tmp_path / "site")
    _fake_torch(site, tmp_path / "torch-ran", 0)
    base = tmp_path / "userbase"
    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    user_site = _dir(base / "lib" / f"python{version}" / "site-packages")
    _write(user_site / "usercustomize.py", MARK.format(mark=str(mark)), NOBODY)
    res = _runner_probe("brctl.diagnostics.collective", ALLTOALL, python=python,
                        env={"PYTHONPATH": str(site), "PYTHONUSERBASE": str(base)})
    assert res.ok and res.document["status"] == "error", res  # the fake torch ran, as root's
    assert not mark.exists(), f"usercustomize ran as uid {mark.read_text()}"


@pytest.mark.slow
def test_real_gloo_workers_pass_and_import_the_declared_sitecustomize(tmp_path: Path) -> None:
    """The workers keep what they need: this venv's torch, and the declared entries'
    ``sitecustomize`` (how the integration tests inject collective faults) once per process."""
    pytest.importorskip("torch")
    mark = tmp_path / "customized"
    site = _dir(tmp_path / "site")
    _write(site / "sitecustomize.py", MARK.format(mark=str(mark)))
    res = _runner_probe("brctl.diagnostics.collective", ALLTOALL, python=sys.executable,
                        env={"PYTHONPATH": str(site)})
    assert res.ok and res.document["status"] == "pass", res
    assert res.document["backend"] == "gloo" and res.document["world"] == 2
    assert mark.read_text().split() == ["0", "0", "0"]  # the probe and its two workers


# A setuptools .pth, as installed (root's): its import line runs _distutils_hack.
PRECEDENCE = ("import os; var = 'SETUPTOOLS_USE_DISTUTILS'; enabled = os.environ.get(var, "
              "'local') == 'local'; enabled and __import__('_distutils_hack').add_shim(); \n")


def _venv_with_pth(tmp_path: Path, mark: Path, owner: int) -> tuple[Path, Path]:
    """A venv (root's) whose site-packages has ``distutils-precedence.pth`` and a
    ``_distutils_hack/__init__.py`` of ``owner`` that writes ``mark``."""
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    _write(site / "distutils-precedence.pth", PRECEDENCE)
    hack = _dir(site / "_distutils_hack")
    init = _write(hack / "__init__.py", MARK.format(mark=str(mark)) + "def add_shim():\n    pass\n",
                  owner)
    return venv, init


def _login_path(monkeypatch: pytest.MonkeyPatch, venv: Path, home: Path | None = None) -> None:
    """Make ``venv``'s python3 the first on the login PATH (a local node's is ours): the
    bootstrap's own interpreter. The node's ``env`` cannot: it is applied after the checks."""
    monkeypatch.setenv("PATH", f"{venv / 'bin'}:{os.environ['PATH']}")
    if home is not None:
        monkeypatch.setenv("HOME", str(home))


@pytest.mark.parametrize("case", ["configured", "bootstrap"])
def test_a_pth_import_line_of_a_job_owned_module_is_refused_before_it_runs(
        tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    mark = tmp_path / "ran"
    venv, init = _venv_with_pth(tmp_path, mark, NOBODY)
    if case == "bootstrap":  # the bootstrap's own python3, which runs the probe itself
        _login_path(monkeypatch, venv)
        kw: dict[str, Any] = {"python": "python3"}
    else:  # the configured interpreter (stage 2)
        kw = {"python": str(venv / "bin" / "python")}
    res = _runner_probe("brctl.diagnostics.sysinfo", **kw)
    assert not mark.exists(), f"ran as uid {mark.read_text()}"
    assert res.run.state is NodeState.REFUSED, res
    assert f"{init} is owned by nobody (uid {NOBODY})" in (res.error or ""), res.error

    os.chown(init, 0, 0)  # root's: imported at startup, as Python would
    res = _runner_probe("brctl.diagnostics.sysinfo", **kw)
    assert res.ok, res
    assert mark.read_text().split()[:1] == ["0"]


def _installed(tmp_path: Path) -> tuple[Path, Path]:
    """A venv (root's) with this brctl's node code installed in its site-packages (root's),
    its ``brctl/__init__.py`` writing a mark when imported."""
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    source = Path(brctl.__file__).parent
    package = site / "brctl"
    shutil.copytree(source / "diagnostics", package / "diagnostics",
                    ignore=shutil.ignore_patterns("__pycache__"))
    init = package / "__init__.py"
    mark = tmp_path / "ran"
    init.write_text((source / "__init__.py").read_text() + MARK.format(mark=str(mark)))
    return venv, package


def test_an_installed_brctl_is_used_only_if_its_package_passes_the_rule(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv, package = _installed(tmp_path)
    mark = tmp_path / "ran"
    # no cached zip in this HOME: the bootstrap looks for an installed brctl
    _login_path(monkeypatch, venv, _dir(tmp_path / "home"))
    kw: dict[str, Any] = {"python": "python3"}
    runner = ProbeRunner(LocalTransport())
    res = _runner_probe("brctl.diagnostics.sysinfo", runner=runner, **kw)
    assert res.ok, res
    assert res.document["brctl_path"] == str(package) and runner.bytes_shipped == 0
    assert mark.read_text().split() == ["0"]

    mark.unlink()
    planted = package / "diagnostics" / "safefs.py"  # the bootstrap imports it before any guard
    os.chown(planted, NOBODY, NOBODY)
    res = _runner_probe("brctl.diagnostics.sysinfo", runner=runner, **kw)
    assert not mark.exists(), f"the installed brctl ran as uid {mark.read_text()}"
    assert res.ok, res  # the zip was shipped and used instead
    assert runner.bytes_shipped == len(runner.bundle.data)
    assert f".cache/brctl/{runner.bundle.digest}/brctl.zip" in res.document["brctl_path"]


def test_an_installed_brctls_site_directory_never_shadows_the_standard_library(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its site-packages is not checked file by file before the guard: a job-owned
    ``glob.py`` there must not be what the bootstrap's ``import glob`` (isolate) runs."""
    venv, package = _installed(tmp_path)
    shadow = tmp_path / "shadowed"
    _write(package.parent / "glob.py", MARK.format(mark=str(shadow)), NOBODY)
    _login_path(monkeypatch, venv, _dir(tmp_path / "home"))
    runner = ProbeRunner(LocalTransport())
    res = _runner_probe("brctl.diagnostics.sysinfo", runner=runner, python="python3")
    assert not shadow.exists(), f"site-packages' glob.py ran as uid {shadow.read_text()}"
    assert res.ok and res.document["brctl_path"] == str(package), res


def test_workers_of_a_run_as_the_job_user_allow_what_the_probe_allows() -> None:
    """Dropped to ``job.user``: the workers import this run's code copy and the job user's
    own module (the launch decision's owners), and refuse a colleague's."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="brctl-job-", dir="/tmp"))  # reachable by nobody
    try:
        base.chmod(0o755)
        out = _dir(base / "out")
        os.chown(out, NOBODY, NOBODY)
        mark = out / "ran"
        site = _dir(base / "site")
        planted = _fake_torch(site, mark, NOBODY)
        kw: dict[str, Any] = {"python": SYSTEM_PYTHON, "env": {"PYTHONPATH": str(site)},
                              "job_user": "nobody"}
        node = Node(name="n", address="n", connection="local", **kw)
        runner = ProbeRunner(LocalTransport())
        res = runner.run([node], "brctl.diagnostics.collective", ALLTOALL, as_job=True,
                         timeout=240)["n"]
        assert res.ok and res.document["status"] == "error", res
        assert set(mark.read_text().split()) == {str(NOBODY)}

        mark.unlink()
        os.chown(planted, 1234, 1234)  # neither root, nor us, nor the job user
        res = runner.run([node], "brctl.diagnostics.collective", ALLTOALL, as_job=True,
                         timeout=240)["n"]
        assert res.run.state is NodeState.REFUSED, res
        assert not mark.exists() and f"{planted} is owned by uid 1234" in (res.error or "")
    finally:
        shutil.rmtree(base, ignore_errors=True)
