"""The collective probe's worker supervision, with scripted workers (no torch, no sockets).

Proves the two clocks (start-up limit, then the test timeout from readiness), the
port relay from rank 0, that a result printed right after ``port N`` is never lost
(the one-process all-to-all that once failed a healthy machine), and that a worker
dying before the rendezvous stops its peers at once.
"""

from __future__ import annotations

import os
import sys
import time

from brctl.diagnostics import collective as c
from tests.kits.waiting import deadline


def _script(body: str) -> list[str]:
    return [sys.executable, "-c", "import sys, time, json\n" + body]


RESULT = 'print(json.dumps({"rank": %d, "finished": True, "data_ok": True, "busbw_gbps": 1.0}))'


def _run(bodies: list[str], startup: float = 20.0, timeout: float = 20.0) -> dict:
    start = time.monotonic()
    workers = [c._Worker(r, _script(b), dict(os.environ), port_later=r > 0)
               for r, b in enumerate(bodies)]
    missed, ready_at = c._supervise(workers, start + startup, timeout)
    return c._summary("alltoall", workers, missed, timeout, startup, start, ready_at)


def test_result_right_after_the_port_line_is_kept() -> None:
    # One write holding "port", "ready" and the result: all three must be seen.
    doc = _run(['sys.stdout.write("port 4242\\nready\\n" + json.dumps({"rank": 0, '
                '"finished": True, "data_ok": True, "busbw_gbps": 2.0}) + "\\n")'])
    assert doc["status"] == "pass" and doc["busbw_gbps"] == 2.0, doc


def test_port_is_relayed_to_the_other_ranks() -> None:
    rank0 = 'print("port 4242", flush=True); print("ready", flush=True); ' + RESULT % 0
    rank1 = ('port = sys.stdin.readline().split()[1]; assert port == "4242", port; '
             'print("ready", flush=True); ' + RESULT % 1)
    doc = _run([rank0, rank1])
    assert doc["status"] == "pass" and doc["world"] == 2, doc


def test_slow_start_is_not_a_hang_but_a_slow_test_is() -> None:
    # 1.5 s to get ready (like importing torch) against a 1 s test timeout: passes.
    slow_start = 'time.sleep(1.5); print("ready", flush=True); ' + RESULT % 0
    doc = _run([slow_start], startup=30, timeout=1.0)
    assert doc["status"] == "pass" and doc["startup_seconds"] >= 1.5, doc
    # Ready at once, then stuck in the collective: a hang in the test phase.
    stuck = 'print("ready", flush=True); time.sleep(600)'
    with deadline(30, "a rank stuck 600 s, killed at readiness + its 0.5 s timeout + grace"):
        doc = _run([stuck], startup=30, timeout=0.5)
    assert (doc["status"], doc["phase"], doc["hung_ranks"]) == ("hang", "test", [0]), doc


def test_never_ready_is_a_startup_hang() -> None:
    doc = _run(['time.sleep(60)'], startup=1.0, timeout=30)
    assert (doc["status"], doc["phase"], doc["hung_ranks"]) == ("hang", "startup", [0]), doc


def test_a_worker_dying_before_the_rendezvous_stops_its_peers() -> None:
    with deadline(30, "a peer waiting 600 s for a rank that died, within a 60 s startup"):
        doc = _run(['sys.stderr.write("RuntimeError: no GPU 0\\n"); sys.exit(1)',
                    'sys.stdin.readline(); time.sleep(600)'], startup=60, timeout=60)
    assert doc["status"] == "error", doc
    assert "rank 0: RuntimeError: no GPU 0" in doc["errors"], doc
