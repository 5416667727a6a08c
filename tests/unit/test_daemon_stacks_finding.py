"""The daemon's finding from brctl stacks cites the flight recorder's evidence (the event
log and brctl report keep the reason)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from brctl.analysis.stacks.evictset import SuspectGroup
from brctl.operations.daemon.hooks import _finding


def _report(evict: tuple[str, ...], suspects: tuple[SuspectGroup, ...]) -> Any:
    return SimpleNamespace(analysis=SimpleNamespace(evict=evict, suspects=suspects))


def test_the_reason_cites_the_recorder() -> None:
    why = "rank 7 never entered all_reduce #4 of DATA_PARALLEL_GROUP (ranks 5,7)"
    got = _finding(_report(("node04",), (SuspectGroup("tp", (3,), ("node04",), "x", (why,)),)),
                   "stack outliers")
    assert (got.decision, got.faulty) == ("evict", ("node04",))
    assert got.reason == f"stack outliers (tp group 3): evict node04; evidence: {why}"


def test_no_eviction_still_says_what_the_recorder_saw() -> None:
    comm = SuspectGroup("communicator", (1,), ("n1", "n2"), "x",
                        ("every rank joined all_reduce #9 of 1 and none completed",))
    got = _finding(_report((), (comm,)), "stack outliers")
    assert got.decision is None and got.faulty == ()
    assert got.reason.startswith("no stack outliers; evidence: every rank joined")
