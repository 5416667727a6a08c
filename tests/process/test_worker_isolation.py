"""The controller's worker interpreters never import from the cwd (issue 35, item 5).

``spawn`` starts ``python -c 'from multiprocessing.spawn import ...'`` (and the
resource tracker ``python -c 'from multiprocessing.resource_tracker ...'``); ``-c``
puts the cwd first on ``sys.path``, so a ``multiprocessing.py`` in the operator's
cwd ran as root in every worker of a large ``brctl exec``. Workers now start as
``python -I``: the parent's own ``sys.path`` is all they import from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from brctl.core.transport import Node
from brctl.remote.fake import FakeTransport, Reply
from brctl.remote.shard import run_sharded

PLANTED = """
import os
with open(os.environ["BRCTL_TEST_PLANTED"], "a") as fh:
    fh.write(f"{os.getpid()}\\n")
raise SystemExit("planted multiprocessing.py ran")
"""


def _answer(node: Node, argv: Any, stdin: Any) -> Reply:
    return Reply(stdout=f"{node.name} {os.getpid()}\n")


def factory() -> FakeTransport:
    """Module level: picklable, rebuilt in each worker."""
    return FakeTransport(_answer)


def test_a_planted_multiprocessing_py_in_the_cwd_never_runs_in_a_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = tmp_path / "operator-cwd"
    cwd.mkdir()
    (cwd / "multiprocessing.py").write_text(PLANTED)
    marker = tmp_path / "planted-ran"
    monkeypatch.setenv("BRCTL_TEST_PLANTED", str(marker))
    monkeypatch.chdir(cwd)
    nodes = [Node(f"n{i}", f"10.0.0.{i}") for i in range(1, 5)]
    results = run_sharded(factory, nodes, ["true"], processes=2, timeout=30, deadline=120)
    assert not marker.exists(), f"the cwd's multiprocessing.py ran in pids {marker.read_text()}"
    assert [r.state.value for r in results.values()] == ["ok"] * 4
    pids = {r.stdout.split()[1] for r in results.values()}
    assert len(pids) == 2 and str(os.getpid()) not in pids  # two real worker processes


def test_where_no_wrapper_may_run_the_fan_out_stays_in_threads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every temp directory noexec (a hardened controller): no worker started unisolated."""
    from brctl.remote import shard

    monkeypatch.setattr(shard, "_isolated", [""])  # as _make_wrapper found no place
    nodes = [Node(f"n{i}", f"10.0.0.{i}") for i in range(1, 5)]
    results = run_sharded(factory, nodes, ["true"], processes=2, timeout=30, deadline=120)
    assert [r.state.value for r in results.values()] == ["ok"] * 4
    assert {r.stdout.split()[1] for r in results.values()} == {str(os.getpid())}
