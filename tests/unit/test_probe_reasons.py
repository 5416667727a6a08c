"""A probe's one-line reason keeps both ends: what was refused (named first) and why (last)."""

from __future__ import annotations

from brctl.core.transport import NodeState, RunResult
from brctl.remote.probes import parse_document

LONG = "/tmp/pytest-of-root/pytest-55/popen-gw0/test_the_declared_loader_and_p0" * 4


def test_a_refusal_naming_long_paths_keeps_the_variable_and_the_verdict() -> None:
    why = f"LD_LIBRARY_PATH entry {LONG}/lib: {LONG}/lib/libfoo.so.1 is owned by nobody (uid 65534)"
    res = RunResult("n", NodeState.REFUSED, 96, "", why, 0.1)
    _, reason = parse_document(res)
    assert reason is not None and reason.startswith("refused: LD_LIBRARY_PATH entry /tmp/")
    assert reason.endswith("is owned by nobody (uid 65534)") and " … " in reason
    assert len(reason) < 700  # still one bounded line: a node may print a megabyte


def test_a_silent_probe_keeps_the_end_of_its_last_stderr_line() -> None:
    line = f"brctl: not caching brctl.zip in {LONG}: {LONG} may be changed by others"
    res = RunResult("n", NodeState.FAILED, 1, "", "noise\n" + line, 0.1)
    _, reason = parse_document(res)
    assert reason is not None and reason.startswith("probe printed nothing (exit 1): brctl: not caching")
    assert reason.endswith("may be changed by others")


def test_a_short_reason_is_kept_whole() -> None:
    res = RunResult("n", NodeState.REFUSED, 96, "", "PYTHONPATH entry /x: owned by nobody", 0.1)
    assert parse_document(res)[1] == "refused: PYTHONPATH entry /x: owned by nobody"
