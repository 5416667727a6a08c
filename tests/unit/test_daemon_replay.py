"""The daemon's replay hook: brctl replay's rounds on the job's current machines."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from brctl.analysis.inventory import from_document
from brctl.core.schema import SchemaError
from brctl.core.transport import Node
from brctl.operations.daemon.hooks import LiveHooks
from brctl.remote.fake import FakeTransport, Reply
from brctl.state import Store

COMMAND = ["train", "--nodes", "{nodes}", "--rank", "{node_rank}", "--port", "{master_port}"]


def inventory(**daemon: Any) -> Any:
    return from_document({
        "nodes": [{"name": "g[01-08]", "address": "10.0.0.[1-8]", "gpus": 2}],
        "standby": [{"name": "s1", "address": "10.0.1.1", "gpus": 2}],
        "job": {"name": "llm", "nodes": "g[01-08]", "pp": 2},
        "daemon": {"metrics_port": 0, **daemon},
    }, "test.yaml")


def machines(faulty: set[str], seen: list[list[str]]) -> FakeTransport:
    """Every group's rank 0 prints its fingerprints; a group holding a faulty machine deviates."""
    def handler(node: Node, argv: Sequence[str], _stdin: bytes | None) -> Reply:
        seen.append([node.name, *argv])
        if argv[argv.index("--rank") + 1] != "0":
            return Reply()
        bad = sorted(set(argv[argv.index("--nodes") + 1].split(",")) & faulty)
        lines = [f"brctl-fingerprint {s} {'bad' + ''.join(bad) if bad and s else f'ok{s}'}"
                 for s in range(3)]
        return Reply(stdout="\n".join(lines) + "\n")
    return FakeTransport(handler)


def test_replay_hook_runs_the_configured_workload_on_the_current_machines(tmp_path: Path) -> None:
    inv = inventory(replay_command=COMMAND)
    seen: list[list[str]] = []
    store = Store(tmp_path / "state")
    try:
        hooks = LiveHooks(inv, machines({"s1"}, seen), store, tmp_path / "state")
        current = [inv.node(n) for n in ("g01", "g02", "s1", *(f"g0{i}" for i in range(4, 9)))]
        outcome = hooks.replay(current)  # s1 was swapped in for g03
    finally:
        store.close()
    assert (outcome.verdict, outcome.faulty) == ("found", ("s1",))
    ran_on = {row[0] for row in seen}
    assert "s1" in ran_on and "g03" not in ran_on
    assert all(row[1] == "train" for row in seen)  # the argv template, never a shell


def test_replay_command_placeholders_are_checked_at_load() -> None:
    with pytest.raises(SchemaError) as err:
        inventory(replay_command=["train", "{reason}"])
    assert "replay_command" in str(err.value) and "reason" in str(err.value)
