"""A machine that lies about its ranks loses its own answer, never the whole analysis.

A compromised or confused machine's stacks probe may report a process with a RANK
outside the job's world, or one claiming a rank that the machine the inventory expects
for it holds under another pid. That machine's answer is dropped (``probe_error``,
naming the claim) and the others are analysed; only a rank held twice where neither
holder is where the inventory puts it stays an error (two jobs match process_match).
"""

from __future__ import annotations

import time

import pytest

from brctl.core.errors import ExitCode, RemoteDataError
from brctl.operations.stacks import ops as op
from tests.unit.test_stacks_reduced import golden_dump

MACHINES = ("m1", "m2", "m3", "m4")
GPUS = 2


def _dump(pid: int, wait: str | None = None) -> str:
    """The real py-spy dump (tests/unit/data) as process ``pid``, its innermost function ``wait``."""
    return golden_dump(pid, function=wait)


def _round(extra: dict[str, list[op.RankDump]], hung: int | None = None) -> op.Collection:
    """Every machine with its own two ranks (rank ``hung`` elsewhere in its code), plus ``extra``."""
    nodes = {}
    for m, name in enumerate(MACHINES):
        ranks = [op.RankDump(r, 1000 + r, _dump(1000 + r, "stuck_here" if r == hung else None), None)
                 for r in (m * GPUS, m * GPUS + 1)]
        nodes[name] = op.NodeCollection(name, "ok", None, (*ranks, *extra.get(name, [])))
    return op.Collection(nodes, time.time(), 0.1)


SHAPE = op.JobShape(MACHINES, (GPUS,) * len(MACHINES), tp=2, pp=2)


def test_a_rank_outside_the_world_drops_only_that_machine() -> None:
    lie = {"m4": [op.RankDump(999_999, 4242, _dump(4242), None)]}
    report = op.analyse([_round(lie, hung=2)], SHAPE)
    assert report.node_errors["m4"].startswith("probe_error: an impossible answer: process 4242 "
                                               "has RANK=999999, outside the job's world of 8")
    assert set(report.node_errors) == {"m4"}
    assert report.exit_code is ExitCode.INCOMPLETE  # a machine gave no usable stacks: said, not hidden
    assert "m2" in report.analysis.evict  # the others were analysed: hung rank 2 is on m2


def test_a_claim_on_a_rank_its_expected_machine_holds_drops_the_claimant() -> None:
    lie = {"m3": [op.RankDump(0, 7777, _dump(7777, "elsewhere"), None)]}  # rank 0 is m1's, pid 1000
    report = op.analyse([_round(lie)] * 2, SHAPE)
    assert "claims RANK=0, which pid 1000 holds on m1" in report.node_errors["m3"]
    assert set(report.node_errors) == {"m3"}
    assert report.topology.rank_machines[0] == "m1"  # the lie moved nothing


def test_a_rank_held_twice_where_the_inventory_expects_neither_is_refused() -> None:
    lie = {"m3": [op.RankDump(1, 7777, _dump(7777), None)], "m4": [op.RankDump(1, 8888, _dump(8888), None)]}
    col = _round(lie)
    col.nodes["m1"] = op.NodeCollection("m1", "unreachable", "no answer")  # rank 1's machine is silent
    with pytest.raises(RemoteDataError, match="RANK=1 is held by two processes: pid 7777 on m3 and "
                                              "pid 8888 on m4"):
        op.analyse([col], SHAPE)


def test_two_processes_with_one_rank_on_its_own_machine_are_two_jobs() -> None:
    lie = {"m1": [op.RankDump(0, 5555, _dump(5555), None)]}
    with pytest.raises(RemoteDataError, match="pid 1000 on m1 and pid 5555 on m1") as err:
        op.analyse([_round(lie)], SHAPE)
    assert "two jobs match job.process_match" in (err.value.hint or "")
