"""Pure analysers of the diagnose stages: DCGM diag JSON, all-to-all, paired all-gather.

Each stage turns the probe documents of the machines it tested into per-machine
``NodeVerdict``s: ``pass``, ``fail`` (a confident fault, with evidence), ``warn`` (not
clean but not a fault: the machine stays in doubt), ``skip`` (the stage cannot run
there, with the reason) or ``error`` (no verdict: the machine could not be tested).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from brctl.analysis.diagnose import doc as dd

Status = Literal["pass", "fail", "warn", "skip", "error"]

# dcgmi returns dcgmReturn_t wrapped to 8 bits (NVIDIA/DCGM#158: 226 is -30).
DCGM_EXIT = {
    0: "pass",
    226: "diagnostic error (DCGM_ST_NVVS_ERROR: a test failed)",
    205: "isolate (DCGM_ST_NVVS_ISOLATE_ERROR: take the GPU out of service)",
    242: "no data (DCGM_ST_NO_DATA: no test ran)",
    255: "bad parameter (DCGM_ST_BADPARAM)",
    203: "diagnostic killed (DCGM_ST_NVVS_KILLED)",
}
DCGM_FAULT_EXITS = (226, 205)
# dcgmErrorSeverity_t: a warning with ISOLATE (2) or RESET (6) severity is a fault even
# when its test says Pass (DCGM#284: errors recorded under a PASS).
DCGM_FAULT_SEVERITIES = (2, 6)


@dataclass(frozen=True)
class NodeVerdict:
    """One machine's outcome in one stage."""

    node: str
    status: Status
    evidence: tuple[str, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"node": self.node, "status": self.status, "evidence": list(self.evidence),
                "details": dict(self.details)}


def parse_dcgm(node: str, doc: Mapping[str, Any]) -> NodeVerdict:
    """Judge one machine's ``dcgmi diag -j`` run (the ``dcgm`` probe's document).

    The document and the dcgmi JSON inside it are the node's, untrusted: any value
    out of shape (``analysis.diagnose.doc``) is that machine's ``error``, never an
    exception (only a fault exit code still fails it, as when dcgmi printed no JSON).
    """
    why = dd.malformed(doc, dd.DCGM, "dcgm answer")
    if why is not None:
        return NodeVerdict(node, "error", (why,))
    if "skipped" in doc:
        return NodeVerdict(node, "skip", (doc["skipped"],))
    if doc.get("timed_out"):
        return NodeVerdict(node, "error",
                           (f"dcgmi diag did not finish in {doc.get('seconds') or 0:.0f}s",))
    code = int(doc.get("exit_code", -1))
    meaning = DCGM_EXIT.get(code, f"unexpected dcgmi exit code {code}")
    details: dict[str, Any] = {"exit_code": code, "exit_meaning": meaning,
                               "seconds": doc.get("seconds")}
    tree, shape_error = _dcgmi_tree(doc.get("stdout") or "null")
    if tree is None:
        status: Status = "fail" if code in DCGM_FAULT_EXITS else "error"
        tail = shape_error or ((doc.get("stderr") or "").strip().splitlines()[-1:]
                               or ["no JSON output"])[0][:200]
        return NodeVerdict(node, status, (f"dcgmi exit {code}: {meaning}; {tail}",), details)
    meta = tree.get("metadata") or {}
    for key, name in (("version", "dcgm_version"), ("Driver Version Detected", "driver_version"),
                      ("EUD Test Version", "eud_version")):
        if key in meta:
            details[name] = meta[key]
    failures, warnings = _dcgm_findings(tree)
    runtime_error = (tree.get("DCGM Diagnostic") or {}).get("runtime_error")
    if runtime_error:
        failures.append(f"runtime error: {runtime_error}")
    if failures or code in DCGM_FAULT_EXITS:
        ev = failures or [f"dcgmi exit {code}: {meaning}"]
        return NodeVerdict(node, "fail", tuple(ev[:10]), details)
    if code != 0:
        return NodeVerdict(node, "error", (f"dcgmi exit {code}: {meaning}",), details)
    if warnings:
        return NodeVerdict(node, "warn", tuple(warnings[:10]), details)
    return NodeVerdict(node, "pass", (), details)


def _dcgmi_tree(stdout: str) -> tuple[Mapping[str, Any] | None, str | None]:
    """dcgmi's JSON tree, or None and (when it is JSON of the wrong shape) why."""
    try:
        tree = json.loads(stdout)
    except (ValueError, RecursionError):  # not JSON; nested past the parser's depth
        return None, None
    if not isinstance(tree, dict) or "DCGM Diagnostic" not in tree:
        return None, None
    why = dd.malformed(tree, dd.DCGMI, "dcgmi JSON", "stdout")
    return (None, why) if why is not None else (tree, None)


def _dcgm_findings(tree: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    failures: list[str] = []
    warnings: list[str] = []
    diag = tree.get("DCGM Diagnostic") or {}
    for category in diag.get("test_categories") or []:
        for test in category.get("tests") or []:
            name = test.get("name", "?")
            for res in test.get("results") or []:
                status = str(res.get("status", "")).lower()
                where = f"{res.get('entity_group', 'GPU')} {res.get('entity_id', '?')}: {name}"
                texts = [_warning_text(w) for w in res.get("warnings") or []]
                severe = any(w.get("error_severity") in DCGM_FAULT_SEVERITIES
                             for w in res.get("warnings") or [])
                if status == "fail" or severe:
                    failures.append(f"{where}: {res.get('status')}" +
                                    (f" ({'; '.join(texts)})" if texts else ""))
                elif texts or status == "warn":
                    warnings.append(f"{where}: {res.get('status')} with warnings" +
                                    (f" ({'; '.join(texts)})" if texts else ""))
    return failures, warnings


def _warning_text(w: Mapping[str, Any]) -> str:
    return (f"error_id {w.get('error_id')} category {w.get('error_category')} "
            f"severity {w.get('error_severity')}: {str(w.get('warning', '')).strip()[:200]}")


def judge_alltoall(docs: Mapping[str, Mapping[str, Any]], ratio: float) -> list[NodeVerdict]:
    """Judge each machine's all-to-all; slow = bus bandwidth < ``ratio`` × fleet median.

    ``docs`` are answers that fit ``diagnose_doc.COLLECTIVE`` (checked where they
    arrive). The median is taken over the machines whose test passed, and only when at least
    three did: with two, "far below the median" cannot say which one is slow.
    """
    out: dict[str, NodeVerdict] = {}
    measured: dict[str, float] = {}
    for node, doc in docs.items():
        details = {k: doc.get(k) for k in ("backend", "world", "busbw_gbps", "seconds")}
        if "skipped" in doc:
            out[node] = NodeVerdict(node, "skip", (doc["skipped"],))
            continue
        status = doc.get("status")
        if status == "hang" and doc.get("phase") == "startup":
            ev = (f"hung: ranks {doc.get('hung_ranks')} did not reach the rendezvous within "
                  f"{doc.get('startup_timeout')}s")
            out[node] = NodeVerdict(node, "fail", (ev, *(doc.get("errors") or [])[:3]), details)
        elif status == "hang":
            ev = (f"hung: ranks {doc.get('hung_ranks')} did not finish within "
                  f"{doc.get('timeout')}s of being ready")
            out[node] = NodeVerdict(node, "fail", (ev, *(doc.get("errors") or [])[:3]), details)
        elif status == "error":
            out[node] = NodeVerdict(node, "fail", tuple(doc.get("errors") or ["a rank failed"]), details)
        elif status == "wrong_data":
            out[node] = NodeVerdict(node, "fail", ("wrong data received",
                                                   *(doc.get("mismatches") or [])), details)
        elif status == "pass":
            out[node] = NodeVerdict(node, "pass", (), details)
            if isinstance(doc.get("busbw_gbps"), (int, float)):
                measured[node] = float(doc["busbw_gbps"])
        else:
            out[node] = NodeVerdict(node, "error", (f"unexpected all-to-all status {status!r}",),
                                details)
    if len(measured) >= 3:
        median = statistics.median(measured.values())
        for node, bw in measured.items():
            if bw < ratio * median:
                out[node] = NodeVerdict(
                    node, "fail",
                    (f"bus bandwidth {bw:.3g} GB/s is below {ratio:g} x the fleet median "
                     f"{median:.3g} GB/s",), {**out[node].details, "median_gbps": median})
    return [out[n] for n in docs]


# pair rounds: 3 name one bad machine among any number (and two); a 4th retests a
# machine blamed only once (its partner may be flaky), so one blamer never condemns
MAX_ROUNDS = 4

Round = Sequence[tuple[Sequence[str], bool]]  # (group, passed) for each group of a round


def cleared_nodes(rounds: Sequence[Round]) -> set[str]:
    """Machines that were in a passing group: their network works."""
    return {n for rnd in rounds for group, ok in rnd if ok for n in group}


def _blamed_by(node: str, rounds: Sequence[Round], cleared: set[str]) -> set[frozenset[str]]:
    """The distinct partner sets of the failed groups of ``node`` whose partners all passed."""
    return {frozenset(p for p in g if p != node) for rnd in rounds for g, ok in rnd
            if not ok and node in g and len(g) > 1 and all(p in cleared for p in g if p != node)}


def judge_rounds(nodes: Sequence[str], rounds: Sequence[Round]) -> tuple[list[str], list[str]]:
    """Faulty machines and ambiguous ones (failed, never cleared, not pinned down), in order.

    A machine is faulty when it failed beside partners that all passed elsewhere,
    with two different sets of such partners: a partner that passed once may be
    flaky itself, so one such failure is retested beside another partner while
    rounds remain, and stays ambiguous when none remain (one blamer at the end
    condemned healthy machines first tested beside a flaky one: 29 of 20,000 trials).
    """
    cleared = cleared_nodes(rounds)
    faulty, ambiguous = [], []
    for node in nodes:
        if node in cleared:
            continue
        if not any(not ok and node in g for rnd in rounds for g, ok in rnd):
            continue
        blamers = _blamed_by(node, rounds, cleared)
        if len(blamers) >= 2:
            faulty.append(node)
        else:
            ambiguous.append(node)
    return faulty, ambiguous


def next_round(nodes: Sequence[str], rounds: Sequence[Round]) -> list[list[str]]:
    """The next round of groups (empty: done), DLRover-style re-pairing.

    Round 1 pairs machines in order (an odd one out waits). Later rounds pair each
    machine still in doubt with a cleared machine (one that passed; those that never
    failed first) it has not met, while there are any, then pair the rest with
    machines they have not met yet.
    """
    if not rounds:
        return [list(nodes[i:i + 2]) for i in range(0, len(nodes) - 1, 2)]
    if len(rounds) >= MAX_ROUNDS:
        return []
    cleared = cleared_nodes(rounds)
    faulty, _ = judge_rounds(nodes, rounds)
    doubt = [n for n in nodes if n not in cleared and n not in faulty]
    met = {(a, b) for rnd in rounds for g, _ in rnd for a in g for b in g}
    failed = {n for rnd in rounds for g, ok in rnd if not ok for n in g}
    # known-good partners: those that never failed first (a flaky one may have passed once)
    good = sorted((n for n in nodes if n in cleared), key=lambda n: n in failed)
    groups: list[list[str]] = []
    left: list[str] = []
    for node in doubt:
        partner = next((p for p in good if (node, p) not in met), None)
        if partner is None:
            left.append(node)
            continue
        good.remove(partner)
        groups.append([node, partner])
    while left:
        node = left.pop(0)
        peer = next((p for p in left if (node, p) not in met), None)
        if peer is not None:
            left.remove(peer)
            groups.append([node, peer])
    return groups
