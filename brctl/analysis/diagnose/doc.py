"""The shapes of the diagnose ladder's probe answers, checked once where each arrives.

Every document a node sends is untrusted (README "Safe by default"): each shape
lists the fields ``operations.diagnose`` and ``analysis.diagnose.stages`` read, with
the JSON types they may have (``brctl.analysis.probe_doc``). An answer out of shape
is that node's error (no verdict: the diagnosis is incomplete there), never an
exception out of the ladder, which the daemon runs mid-plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from brctl.analysis import probe_doc
from brctl.analysis.probe_doc import OPT_FINITE, OPT_STR, SCALAR, MapOf, Required

_STRS = ([str], None)

# brctl.diagnostics.evidence: log tails by path, Xid lines, live training processes.
EVIDENCE: dict[str, Any] = {
    "logs": (MapOf([str]), None),
    "log_errors": _STRS,
    "xid_lines": _STRS,
    "kernel_error": OPT_STR,
    "processes": ([{"pid": Required(int), "cmdline": Required(str)}], None),
}

# brctl.diagnostics.dcgm: a dcgmi diag run (its JSON is in ``stdout``: DCGMI below).
DCGM: dict[str, Any] = {
    "skipped": str,
    "timed_out": (bool, None),
    "seconds": OPT_FINITE,
    "exit_code": int,
    "stdout": OPT_STR,
    "stderr": OPT_STR,
}

_WARNING = {"error_severity": SCALAR, "error_id": SCALAR, "error_category": SCALAR,
            "warning": SCALAR}
_RESULT = {"status": SCALAR, "entity_group": SCALAR, "entity_id": SCALAR,
           "warnings": ([_WARNING], None)}
_TEST = {"name": SCALAR, "results": ([_RESULT], None)}
# ``dcgmi diag -j``'s tree, as parse_dcgm reads it.
DCGMI: dict[str, Any] = {
    "metadata": ({"version": SCALAR, "Driver Version Detected": SCALAR,
                  "EUD Test Version": SCALAR}, None),
    "DCGM Diagnostic": ({"test_categories": ([{"tests": ([_TEST], None)}], None),
                         "runtime_error": SCALAR}, None),
}

# brctl.diagnostics.collective, op free_port: the rendezvous port of a group's master.
FREE_PORT: dict[str, Any] = {"port": (int, None)}

# brctl.diagnostics.collective, ops alltoall and allgather: one machine's outcome.
COLLECTIVE: dict[str, Any] = {
    "skipped": str,
    "status": OPT_STR,
    "phase": OPT_STR,
    "backend": OPT_STR,
    "world": (int, None),
    "timeout": OPT_FINITE,
    "startup_timeout": OPT_FINITE,
    "hung_ranks": ([SCALAR], None),
    "errors": _STRS,
    "mismatches": _STRS,
    "busbw_gbps": OPT_FINITE,
    "startup_seconds": OPT_FINITE,
    "seconds": OPT_FINITE,
}


def malformed(doc: Any, shape: Mapping[str, Any], what: str, path: str = "document"
              ) -> str | None:
    """``malformed {what}: <first field out of shape>``, or None when ``doc`` fits."""
    why = probe_doc.malformed(doc, shape, path)
    return None if why is None else f"malformed {what}: {why}"
