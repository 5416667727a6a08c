"""Test tiers: tests/unit (pure, no sockets) and tests/integration (real sshd on loopback).

Tests are marked by folder. Unit tests get sockets disabled, so a unit test that
reaches the network fails loudly instead of silently depending on it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        tier = parts[0] if len(parts) > 1 else "unit"
        if tier == "integration":
            item.add_marker(pytest.mark.integration)
        elif tier == "gpu":
            item.add_marker(pytest.mark.gpu)
        elif tier != "unit":
            raise pytest.UsageError(f"test outside a known tier: {item.nodeid} (unit/integration/gpu)")


class _NoSockets(socket.socket):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("unit tests must not open sockets (use FakeTransport)")


@pytest.fixture(autouse=True)
def _no_sockets_in_unit_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    if "tests/unit" not in str(request.node.fspath).replace("\\", "/"):
        yield
        return
    original = socket.socket
    socket.socket = _NoSockets  # type: ignore[misc]
    try:
        yield
    finally:
        socket.socket = original  # type: ignore[misc]


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
    from brctl.cli import run
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
