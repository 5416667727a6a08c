"""The JSON Schemas (draft 2020-12) of brctl's ``--json`` documents.

Each names the keys a script may rely on (``required``) and their types; a
document may carry more keys than listed (new keys are added without a version
bump; a key that changes meaning or goes away bumps ``/<n>``).
"""

from __future__ import annotations

from typing import Any

from brctl.analysis.report.lost_time import CAUSES

Schema = dict[str, Any]

STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
NUM: Schema = {"type": "number"}
BOOL: Schema = {"type": "boolean"}
ANY: Schema = {}
OBJ: Schema = {"type": "object"}
NAMES: Schema = {"type": "array", "items": STR}
TIME: Schema = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$"}
STATUS: Schema = {"enum": ["ok", "findings", "incomplete", "refused", "error", "interrupted"]}


def opt(schema: Schema) -> Schema:
    """``schema`` or null."""
    return {"anyOf": [schema, {"type": "null"}]}


def arr(items: Schema) -> Schema:
    """A list of ``items``."""
    return {"type": "array", "items": items}


def obj(props: dict[str, Schema], *required: str) -> Schema:
    """An object with these properties; ``required`` (default: all of them)."""
    return {"type": "object", "properties": props,
            "required": list(required) if required else list(props)}


def by_node(value: Schema) -> Schema:
    """The ``nodes`` map: machine name → ``value``."""
    return {"type": "object", "additionalProperties": value}


def document(name: str, props: dict[str, Schema], *, judges: bool) -> Schema:
    """The schema of the document called ``name`` (every listed key required)."""
    head: dict[str, Schema] = {"schema": {"const": name}, "generated_at": TIME}
    if judges:
        head["status"] = STATUS
    body = obj({**head, **props})
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": name,
            "title": name, **body}


# a state database row a reporting command left out because it did not decode (exit 3)
SKIPPED_ROW = obj({"table": STR, "key": STR, "why": STR})
# stdout_total/stderr_total: bytes in all, only for a stream that was cut (brctl.core.capture);
# stdout_b64/stderr_b64: the kept bytes exactly, only where they are not valid UTF-8.
RUN_RESULT = obj({"state": {"enum": ["ok", "failed", "timeout", "unreachable", "auth",
                                     "hostkey", "refused"]},
                  "exit_code": opt(INT), "stdout": STR, "stderr": STR, "seconds": NUM,
                  "stdout_total": INT, "stderr_total": INT,
                  "stdout_b64": {"type": "string", "contentEncoding": "base64"},
                  "stderr_b64": {"type": "string", "contentEncoding": "base64"}},
                 "state", "exit_code", "stdout", "stderr", "seconds")
CHECK = obj({"name": STR, "status": {"enum": ["ok", "warn", "fail", "unknown", "skip"]},
             "message": STR, "evict": BOOL}, "name", "status", "message")
HOOK = obj({"argv": NAMES, "exit_code": opt(INT), "stdout": STR, "stderr": STR, "seconds": NUM})
GROUP = obj({"index": INT, "ranks": arr(INT), "members": NAMES}, "index", "members")
STAGE = obj({"name": STR, "nodes_tested": NAMES, "faulty": NAMES, "seconds": NUM,
             "skipped": NAMES,
             "nodes": by_node(obj({"status": {"enum": ["pass", "fail", "warn", "skip", "error"]},
                                   "evidence": NAMES, "details": OBJ})),
             "rounds": arr(arr(obj({"members": NAMES, "ok": BOOL})))},
            "name", "nodes_tested", "faulty", "seconds", "nodes")
REPLAY_GROUP = obj({"members": NAMES, "fingerprint": opt(STR), "deviant": opt(BOOL)})
REPLAY_PLAN = obj({"dp": INT, "tp": INT, "pp": INT, "machines_per_group": INT,
                   "groups_per_round": INT, "grid": BOOL, "can_vote": BOOL,
                   "rounds_single_fault": opt(INT), "round1": arr(NAMES),
                   "round2": opt(arr(NAMES))})
UPDATE_OUTCOME = obj({"state": STR, "message": STR, "bytes_sent": INT})
SWITCH = {"action": {"enum": ["apply", "rollback"]}, "job": STR, "version": opt(STR),
          "from_version": opt(STR), "outcome": STR, "reason": STR,
          "nodes": by_node(UPDATE_OUTCOME), "restart": opt(HOOK)}
COPY = obj({"owner": STR, "source": STR, "dest": STR, "state": STR, "step": opt(STR),
            "files": INT, "copied": INT, "skipped": INT, "bytes": INT, "seconds": NUM,
            "error": opt(STR), "notes": NAMES, "warnings": NAMES, "from_path": opt(STR),
            "to_path": opt(STR), "send": NAMES})
POOL_MACHINE = obj({"status": STR, "detail": STR, "checked_at": opt(NUM)})
EVICT = {"action": {"enum": ["evict", "unevict"]}, "dry_run": BOOL, "operator": STR,
         "forced": opt(STR), "members": NAMES,
         "nodes": by_node(obj({"changed": BOOL, "reason": STR, "command": opt(NAMES),
                               "hook": opt(HOOK), "remains": opt(STR)})),
         "notify_errors": NAMES}

_DOCS: list[tuple[str, dict[str, Schema], bool]] = [
    ("brctl.error/1", {"exit": INT, "message": STR, "hint": opt(STR), "file": opt(STR),
                       "key": opt(STR), "line": opt(INT)}, True),
    ("brctl.nodes/1", {
        "inventory": STR,
        "nodes": by_node(obj({"address": STR, "port": INT, "user": STR, "connection": STR,
                              "gpus": INT, "labels": {"type": "object",
                                                      "additionalProperties": STR},
                              "role": STR, "probe": obj({"state": STR, "ok": BOOL,
                                                         "error": opt(STR)})},
                             "address", "port", "user", "connection", "gpus", "labels", "role")),
        # a Slurm job that is not running: source and state, no members, no sizes
        "job": opt(obj({"name": STR, "source": STR, "state": opt(STR), "members": NAMES,
                        "world": INT, "tp": INT, "cp": INT, "ep": INT, "dp": INT, "pp": INT,
                        "order": STR}, "name", "source", "state", "members")),
        "groups": {"type": "object", "additionalProperties": arr(GROUP)}}, False),
    ("brctl.nodes.set/1", {"mode": {"enum": ["fold", "expand", "count"]}, "nodeset": STR,
                           "members": NAMES, "count": INT}, False),
    ("brctl.update.preview/1", {
        "action": {"enum": ["push", "apply", "rollback"]}, "job": STR, "version": opt(STR),
        "from_version": opt(STR), "members": NAMES, "steps": NAMES, "restart": opt(NAMES),
        "dry_run": BOOL}, False),
    ("brctl.init/1", {"path": STR, "example": STR}, False),
    ("brctl.exec/1", {"argv": NAMES, "nodes": by_node(RUN_RESULT)}, True),
    ("brctl.health/1", {
        "nodes": by_node(obj({"status": STR, "checks": arr(CHECK), "error": opt(STR),
                              "seconds": NUM})),
        "evict": {"type": "object", "additionalProperties": STR},
        "incomplete": NAMES, "unknown": NAMES}, True),
    ("brctl.diagnose/1", {
        "job": opt(STR), "symptom": STR, "stages": arr(STAGE), "faulty": NAMES,
        "decision": {"enum": ["evict", "reattempt", "rollback", "replay"]}, "reason": STR,
        "incomplete": OBJ, "seconds": NUM}, True),
    # the stacks document's content is the stack analysis' (loose here: its keys only)
    ("brctl.stacks/2", {"classes": arr(OBJ), "outliers": arr(OBJ), "suspect_groups": arr(OBJ),
                        "evict": NAMES, "nodes": by_node(OBJ)}, True),
    ("brctl.replay/1", {
        "verdict": opt({"enum": ["found", "none", "ambiguous", "not_reproduced", "incomplete"]}),
        "plan": REPLAY_PLAN,
        "rounds": arr(obj({"index": INT, "kind": STR, "groups": arr(REPLAY_GROUP)}))}, True),
    ("brctl.ckpt.plan/1", {"job": STR, "ok": BOOL, "placements": arr(obj({
        "node": STR, "backup_node": opt(STR), "meets_rule": BOOL, "how": STR,
        "shared_kinds": NAMES, "same_domain": BOOL})), "notes": NAMES}, True),
    ("brctl.ckpt.verify/1", {"ok": BOOL, "evictions": INT, "machines": INT,
                             "violations": arr(obj({"kind": STR, "group": ANY, "members": NAMES,
                                                    "lost": NAMES})),
                             "loss_probability": {"type": "object",
                                                  "additionalProperties": opt(NUM)}}, True),
    ("brctl.ckpt.backup/1", {"copies": arr(COPY)}, True),
    ("brctl.ckpt.restore/1", {"copies": arr(COPY)}, True),
    ("brctl.update.push/1", {
        "job": STR, "version": STR, "sha256": STR, "size": INT, "source": STR, "urgent": BOOL,
        "bytes_sent": INT, "message": STR, "nodes": by_node(UPDATE_OUTCOME),
        "pending": opt(OBJ), "switch": opt(obj(SWITCH))}, True),
    ("brctl.update.apply/1", SWITCH, True),
    ("brctl.update.rollback/1", SWITCH, True),
    ("brctl.update.status/1", {
        "job": STR, "version": opt(STR), "sha256": opt(STR), "pending": opt(OBJ), "due": BOOL,
        "drift": NAMES, "unknown": NAMES,
        "nodes": by_node(obj({"state": STR, "current": opt(STR), "releases": NAMES,
                              "pending_staged": opt(BOOL), "drift": BOOL, "error": opt(STR)}))},
     True),
    ("brctl.update.history/1", {"job": STR, "events": arr(OBJ)}, False),
    ("brctl.daemon.run/1", {"job": STR, "iterations": INT, "incidents": arr(OBJ),
                            "refusals": NAMES, "resumed": ANY, "members": NAMES,
                            "ettr": opt(NUM), "stopped_by": opt(STR)}, True),
    ("brctl.daemon.status/1", {
        "job": STR, "running": BOOL, "lease": opt(OBJ), "last_poll": opt(NUM), "summary": OBJ,
        "events": arr(obj({"id": INT, "at": NUM, "kind": STR, "members": NAMES, "detail": OBJ},
                          "at", "kind", "members", "detail")),
        "actions": arr(OBJ), "quarantined": arr(OBJ), "skipped_rows": arr(SKIPPED_ROW)}, True),
    ("brctl.daemon.rearm/1", {"job": STR, "rearmed": BOOL, "was": opt(STR), "operator": STR,
                              "reason": STR, "notify_errors": NAMES}, False),
    ("brctl.evict/2", EVICT, True),
    ("brctl.unevict/2", EVICT, True),
    ("brctl.standby.size/1", {"size": INT, "machines": INT, "quantile": NUM,
                              "window_hours": NUM, "daily_failure_rate": NUM,
                              "window_probability": NUM, "source": STR,
                              "expected_failures": NUM, "configured": opt(INT)}, False),
    ("brctl.standby.list/1", {"nodes": by_node(POOL_MACHINE), "ready": NAMES}, False),
    ("brctl.standby.check/1", {"nodes": by_node(POOL_MACHINE), "ready": NAMES}, True),
    ("brctl.ettr/1", {"job": STR, "cumulative": opt(NUM), "window_seconds": NUM,
                      "window": opt(NUM), "productive_seconds": NUM, "observed_seconds": NUM,
                      "series": arr(obj({"at": NUM, "ettr": opt(NUM)})),
                      "lost_seconds": obj({c: NUM for c in CAUSES}),
                      "skipped_rows": arr(SKIPPED_ROW)}, False),
    ("brctl.report/1", {
        "html": STR, "png": opt(STR), "job": STR, "start": opt(NUM), "end": opt(NUM),
        "cumulative": opt(NUM), "productive_seconds": NUM, "observed_seconds": NUM,
        "window_seconds": NUM, "incidents": INT, "members": NAMES,
        "lost_seconds": obj({c: NUM for c in CAUSES}),
        "nodes": by_node(obj({"roles": NAMES, "first": NUM, "last": NUM, "events": INT,
                              "evicted_at": opt(NUM), "reason": opt(STR),
                              "released": opt(NUM)})),
        "skipped_rows": arr(SKIPPED_ROW)}, False),
    ("brctl.simulate/1", {
        "mix": STR, "machines": INT, "days": NUM, "ckpt_interval": NUM, "standby": INT,
        "seed": INT, "sweep": opt(STR), "seconds": NUM, "window": NUM,
        "kinds": arr(obj({"name": STR, "rate": NUM,
                          "signal": {"enum": ["gpu_fault", "crash", "hang"]},
                          "resolution": {"enum": ["evict", "reattempt", "rollback", "replay"]}})),
        "durations": {"type": "object", "additionalProperties": NUM},
        "rows": arr(obj({"value": opt(NUM), "runs": INT, "ettr": NUM, "ettr_p10": NUM,
                         "ettr_p50": NUM, "ettr_p90": NUM, "worst_day_ettr": NUM,
                         "ettr_series": arr(NUM),
                         "lost_seconds": {"type": "object", "additionalProperties": NUM},
                         "resolved_by": {"type": "object", "additionalProperties": NUM},
                         "incidents": NUM, "standby_exhausted": NUM, "cap_refusals": NUM,
                         "pages": NUM}))}, False),
]

DOCUMENTS: dict[str, Schema] = {name: document(name, props, judges=judges)
                                for name, props, judges in _DOCS}

# brctl.stacks/2's flight-recorder keys (issue 32): present only when some rank's
# recorder was read, so described but not required (new keys, no version bump).
# suspect_groups[].evidence: per blamed rank, what its recorder and stack say;
# suspect_groups[].kind "communicator": listed for the all-gather ladder, never evicted.
_WAITS = arr(obj({"rank": INT, "group": STR, "seq": INT}))
STACKS_RECORDER: dict[str, Schema] = {
    "collective_groups": arr(obj({
        "group": STR, "desc": STR, "ranks": arr(INT), "kind": STR, "index": opt(INT),
        "members_from": {"enum": ["table", "layout", "reporters"]}, "seq": INT, "op": STR,
        "verdict": {"enum": ["in_flight", "stuck", "mismatch", "communicator"]},
        "age_s": NUM, "joined": arr(INT), "missing": arr(INT), "no_answer": arr(INT),
        "mismatched": arr(INT), "waits": _WAITS, "detail": STR})),
    "collective_culprits": arr(obj({
        "rank": INT, "why": {"enum": ["never_entered", "mismatch", "no_answer", "cycle"]},
        "group": STR, "seq": INT, "text": STR, "corroborated": BOOL})),
    "stragglers": arr(obj({
        "rank": INT, "group": STR, "desc": STR, "late_in": INT, "window": INT, "late_ms": NUM,
        "role": {"enum": ["straggler", "victim"]}, "victim_of": opt(INT), "trusted": BOOL})),
    "arrival": {"enum": ["enqueue", "started", "unknown"]},
    "stuck_after_s": NUM,
    "straggler_threshold_ms": NUM,
}
DOCUMENTS["brctl.stacks/2"]["properties"].update(STACKS_RECORDER)
