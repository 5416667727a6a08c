"""Test tiers, decided by folder and marked here (``TIERS``):

- tests/unit: pure — no process started, no socket opened (both fail the test loudly),
  so ``scripts/test --quick`` can run it in a minute or two;
- tests/process: starts real local processes (brctl's CLI, scripts, helpers), no network;
- tests/integration: real sshd / Slurm / chromium on loopback;
- tests/gpu: needs an NVIDIA GPU, skipped without one.

A new tier folder gets its row in ``TIERS``; a test outside them is a usage error.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Folder under tests/ -> the marker its tests get (``-m process``, ``-m "not integration"``).
TIERS = {
    "unit": pytest.mark.unit,
    "process": pytest.mark.process,
    "integration": pytest.mark.integration,
    "gpu": pytest.mark.gpu,
}


def pytest_configure(config: pytest.Config) -> None:
    # Started in the background from a script (`scripts/test &`, nohup), the suite inherits
    # SIGINT ignored, and so would every brctl it starts: Python then never raises
    # KeyboardInterrupt, and the Ctrl-C tests' SIGINT is lost. A Python handler is reset to
    # the default in a child at exec, so installing Python's own makes children interruptible.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# Session-wide clusters (tests/integration/conftest.py): under pytest-xdist each worker would
# start its own, so the tests sharing one are one xdist group (``--dist loadgroup``).
SHARED_CLUSTERS = ("ssh_cluster", "slurm_cluster")


def _xdist_group(item: pytest.Item) -> str | None:
    """The group of tests that must share a worker with ``item``: those using the same
    session cluster, or the same module-scoped fixture (its module); None: any worker."""
    names = getattr(item, "fixturenames", ())
    for name in SHARED_CLUSTERS:
        if name in names:
            return name
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info is not None else ()):
        if defs and defs[-1].scope == "module":
            return item.nodeid.split("::")[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        tier = parts[0] if len(parts) > 1 else "unit"
        if tier not in TIERS:
            raise pytest.UsageError(f"test outside a known tier: {item.nodeid} ({'/'.join(TIERS)})")
        item.add_marker(TIERS[tier])
        group = _xdist_group(item) if tier == "integration" else None
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def _in_tier(request: pytest.FixtureRequest, *tiers: str) -> bool:
    path = str(request.node.fspath).replace("\\", "/")
    return any(f"/tests/{tier}/" in path for tier in tiers)


class _NoSockets(socket.socket):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("unit tests must not open sockets (use FakeTransport)")


@pytest.fixture(autouse=True)
def _no_sockets_in_unit_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    """No sockets in the pytest process for the pure and process tiers (their children are
    the process tier's business: a local CLI, a script)."""
    if not _in_tier(request, "unit", "process"):
        yield
        return
    original = socket.socket
    socket.socket = _NoSockets  # type: ignore[misc]
    try:
        yield
    finally:
        socket.socket = original  # type: ignore[misc]


@pytest.fixture(autouse=True)
def _no_processes_in_unit_tests(request: pytest.FixtureRequest,
                                monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """In tests/unit every way to start a process raises, and the test fails even when the
    code under test caught that error: a test that needs a process belongs in tests/process."""
    if not _in_tier(request, "unit"):
        yield
        return
    import _posixsubprocess

    tried: list[str] = []

    def refuse(name: str) -> Any:
        def refused(*args: Any, **kwargs: Any) -> Any:
            tried.append(name)
            raise RuntimeError(f"unit tests must not start processes ({name}): "
                               "move the test to tests/process")
        return refused

    # subprocess.Popen (and asyncio's, os.popen) forks through _fork_exec or posix_spawn;
    # multiprocessing through _posixsubprocess.fork_exec or os.fork; pty through forkpty.
    monkeypatch.setattr(subprocess, "_fork_exec", refuse("subprocess"))
    monkeypatch.setattr(_posixsubprocess, "fork_exec", refuse("fork_exec"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse(f"os.{name}"))
    yield
    if tried:
        pytest.fail(f"unit test started a process ({', '.join(sorted(set(tried)))}): "
                    "move it to tests/process", pytrace=False)


@dataclass
class CliResult:
    """What one ``brctl`` invocation produced."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        """The stdout document, validated against its shipped JSON Schema."""
        return validated(json.loads(self.stdout))


# Every schema name a test validated a real document against (tests/unit/
# test_schema_coverage.py checks that each shipped schema is among them).
VALIDATED: set[str] = set()


def validated(doc: Any) -> Any:
    """``doc`` after checking it against the JSON Schema its ``schema`` key names.

    Every test that reads a command's --json output checks the published contract:
    a document whose schema is not shipped, or that does not fit it, fails the test.
    """
    import jsonschema

    from brctl import schemas

    assert isinstance(doc, dict) and "schema" in doc, f"not a brctl document: {doc!r:.200}"
    assert doc["schema"] in schemas.names(), f"{doc['schema']}: no shipped JSON Schema"
    jsonschema.validate(doc, schemas.get(doc["schema"]))
    VALIDATED.add(doc["schema"])
    return doc


@pytest.fixture
def brctl(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """Run brctl in-process: ``brctl("-i", inv, "nodes")`` → CliResult.

    ``transport``: run the real commands over it (a ``FakeTransport``); ``sleep``: what
    the run waits with (a fake that changes a machine between sweeps).
    """
    from brctl.cli.app import run
    from brctl.env import Env

    def invoke(*args: str, env: dict[str, str] | None = None, transport: Any = None,
               sleep: Any = None) -> CliResult:
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        capsys.readouterr()
        given = None  # built here, after capsys: its output is the captured stdout/stderr
        if transport is not None or sleep is not None:
            given = Env(transport_given=transport, **({"sleep": sleep} if sleep else {}))
        code = run([str(a) for a in args], env=given)
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return invoke


@pytest.fixture
def trusted_tmp() -> Iterator[Path]:
    """A temp dir that passes OpenSSH's StrictModes rule (``safefs.unsafe_owner_chain``).

    ``tmp_path`` lives under ``/tmp``, which is world-writable: brctl refuses to keep
    root's files (a ckpt backup root) below it. This one is made under the first of
    ``/run``, ``/var/lib`` and ``~/.cache`` whose every component is owned by root or
    us and not group/other writable.
    """
    from brctl.diagnostics.safefs import unsafe_owner_chain

    trusted = (0, os.geteuid())
    base = next((p for p in ("/run", "/var/lib", os.path.expanduser("~/.cache"))
                 if os.path.isdir(p) and os.access(p, os.W_OK)
                 and unsafe_owner_chain(p, trusted) is None), None)
    if base is None:
        pytest.skip("no directory here passes the StrictModes rule")
    path = Path(tempfile.mkdtemp(prefix="brctl-test-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own $BRCTL_STATE: a hand command records to the audit trail,
    and none may write to the state directory of whoever runs the suite."""
    monkeypatch.setenv("BRCTL_STATE", str(tmp_path / "state"))


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private $BRCTL_STATE for the test."""
    path = tmp_path / "state"
    monkeypatch.setenv("BRCTL_STATE", str(path))
    return path


PYTHON = sys.executable


def local_release_world(tmp_path: Path) -> tuple[Path, Path]:
    """``examples/local.yaml`` with each machine's ``update.root`` under ``tmp_path``, and a
    one-file release directory to push: (inventory, release dir)."""
    import yaml

    doc = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    doc["update"] = {"root": str(tmp_path / "nodes" / "{node}")}
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc))
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print(1)\n")
    return inv, src
