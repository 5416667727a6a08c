"""The stacks probe against hostile rank sockets: real Unix sockets served by a small
stdlib HTTP server (not torch), run as an unprivileged job user.

One fake job (a tagged parent and seven RANK children, uid 65534) whose ranks each
serve one behaviour on ``$BRCTL_JOB_SOCKET_DIR/rank-<R>.sock``: a good answer, a
huge one, a deeply nested one, wrong types, a socket that accepts and never
answers, a socket served by a process outside the job, a planted link to a
root socket, a chunked answer with a negative chunk size, a Content-Length in
latin-1 digits, a 5,000-digit integer. The probe (node-side code, run here as root) must make each one
that rank's error, send nothing to a peer that is not the job, and finish in
bounded time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from brctl.diagnostics.stacks_probe import collect
from tests.kits.cluster import scaled
from tests.kits.waiting import wait_for

pytestmark = [pytest.mark.integration]

TAG = "brctl-fr-hostile"
NOBODY = 65534
PY = "/usr/bin/python3"  # stdlib only; the job user may not reach the venv's interpreter
SERVER = r'''
import json, os, socket, sys, threading, time

mode, path, log = sys.argv[1], sys.argv[2], sys.argv[3]
DUMP = {"version": "2.10", "pg_config": {}, "pg_status": {"0": {
        "last_enqueued_collective": "1", "last_started_collective": "-1",
        "last_completed_collective": "1"}},
        "entries": [{"record_id": 0, "pg_id": 0, "process_group": ["0", "default_pg"],
                     "collective_seq_id": 1, "p2p_seq_id": 0, "op_id": 1,
                     "profiling_name": "gloo:all_reduce", "time_created_ns": 1,
                     "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]],
                     "output_dtypes": ["Float"], "state": "scheduled", "retired": True,
                     "timeout_ms": 1800000, "is_p2p": False}]}


def body(handler):
    if mode == "deep":
        return b"[" * 200000 + b"]" * 200000
    if mode == "types":
        return json.dumps({"version": 7, "entries": "none"}).encode()
    if handler == "brctl_job":
        return json.dumps({"v": 1, "rank": int(os.environ["RANK"]), "pid": os.getpid(),
                           "groups": {"0": {"desc": "default_pg", "ranks": [0]}},
                           "step": 3}).encode()
    if handler == "dump_traceback":
        return b"Thread 0x1 (most recent call first):\n  File \"x.py\", line 1 in main\n"
    return json.dumps(DUMP).encode()


def serve(path):
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(16)
    while True:
        conn, _ = srv.accept()
        conn.settimeout(30)
        got = b""
        try:
            while b"\r\n\r\n" not in got:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                got += chunk
            with open(log, "a") as fh:
                fh.write("%d\n" % len(got))
            if not got:
                continue  # closed unsent (the probe's peer check)
            if mode == "silent":
                time.sleep(3600)
            handler = got.split(b" ")[1].rsplit(b"/", 1)[-1].decode()
            if mode == "chunked":  # a negative chunk size: once looped the reader forever
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-6\r\nabcdefgh")
                continue
            if mode == "superscript":  # str.isdigit() is True for a latin-1 superscript
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n{}")
                continue
            if mode == "bigint":
                data = b'{"version": "2.10", "entries": [], "x": ' + b"9" * 5000 + b"}"
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
                continue
            if mode == "huge":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
                while True:
                    conn.sendall(b"x" * 65536)
            data = body(handler)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
        except OSError:
            pass
        finally:
            conn.close()


if path.endswith(".sock"):  # brctl.job's facts beside torch's socket, from the same process
    threading.Thread(target=serve, args=(path[:-5] + ".brctl.sock",), daemon=True).start()
serve(path)
'''
# rank → what its socket does; 5 and 6 are served by processes outside the job
MODES = {0: "good", 1: "huge", 2: "deep", 3: "types", 4: "silent", 5: None, 6: None,
         7: "chunked", 8: "superscript", 9: "bigint"}


def _wait(paths: list[Path], timeout: float) -> None:
    wait_for(lambda: all(p.exists() for p in paths), f"sockets served: {[str(p) for p in paths]}",
             timeout, every=0.05)


@pytest.fixture
def hostile_job() -> Iterator[tuple[Path, Path]]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the job runs as another uid")
    top = Path(tempfile.mkdtemp(prefix="brctl-fr-"))
    top.chmod(0o755)
    socks, logs, rootdir = top / "socks", top / "logs", top / "root"
    for d in (socks, logs):
        d.mkdir(mode=0o700)
        os.chown(d, NOBODY, NOBODY)
    rootdir.mkdir(mode=0o700)
    script = top / "server.py"
    script.write_text(SERVER)
    script.chmod(0o644)
    children = "; ".join(
        f"subprocess.Popen([sys.executable, {str(script)!r}, {mode!r}, "
        f"{str(socks / f'rank-{r}.sock')!r}, {str(logs / f'{r}.log')!r}], "
        f"env=dict(os.environ, RANK='{r}', WORLD_SIZE='10'))"
        for r, mode in MODES.items() if mode)
    children += "; " + "; ".join(  # ranks 5 and 6 run but do not serve
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'], "
        f"env=dict(os.environ, RANK='{r}', WORLD_SIZE='10'))" for r in (5, 6))
    parent = f"import os, subprocess, sys, time; {children}; time.sleep(3600)"
    env = {"PATH": "/usr/bin:/bin", "BRCTL_JOB_SOCKET_DIR": str(socks)}
    procs = [subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                               "--clear-groups", PY, "-c", parent, TAG], env=env)]
    # rank 5's socket: the job user's, served by a process outside the job's tree
    procs.append(subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                                   "--clear-groups", PY, str(script), "good",
                                   str(socks / "rank-5.sock"), str(logs / "5.log")], env=env))
    # rank 6's socket: a planted link to a root socket
    procs.append(subprocess.Popen([sys.executable, str(script), "good",
                                   str(rootdir / "daemon.sock"), str(top / "6.log")], env=env))
    try:
        _wait([socks / f"rank-{r}.sock" for r in (0, 1, 2, 3, 4, 5, 7, 8, 9)]
              + [rootdir / "daemon.sock"], 30)
        (socks / "rank-6.sock").symlink_to(rootdir / "daemon.sock")
        yield top, logs
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(procs[0].pid)], check=False)
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(top, ignore_errors=True)


def test_every_hostile_socket_is_that_ranks_error(hostile_job: tuple[Path, Path]) -> None:
    top, logs = hostile_job
    timeout = 1.0
    began = time.monotonic()
    doc = collect({"process_match": TAG, "py_spy": None, "dump_timeout": scaled(10),
                   "recorder": {"timeout": scaled(timeout), "k": 20}})
    took = time.monotonic() - began
    rows = {r["rank"]: r for r in doc["recorder"]}
    assert sorted(rows) == list(range(10)), doc["recorder"]
    good = rows[0]
    assert (good["state"], good["channel"], good["table"], good["traceback"]) == (
        "read", "brctl-socket", True, True), good
    assert good["summary"]["groups"]["0"]["last_completed"] == 1
    assert good["summary"]["step"] == 3
    assert "over" in rows[1]["error"] and rows[1]["summary"] is None, rows[1]
    assert "nested" in rows[2]["error"] or "not JSON" in rows[2]["error"], rows[2]
    assert "not a flight-recorder dump" in rows[3]["error"], rows[3]
    # silent socket: py-spy still read its stack, so the rank is read, the socket's error said
    assert rows[4]["summary"] is None and "no answer in time" in rows[4]["error"], rows[4]
    assert rows[4]["state"] == "read" and doc["errors"] == []
    # closed unsent: the impostor never saw a byte; the planted link was never connected
    assert "not a process of the job; closed unsent" in rows[5]["error"], rows[5]
    assert "rank-6.sock is a symlink; not used" in rows[6]["error"], rows[6]
    for rank in (5, 6):
        assert rows[rank]["summary"] is None and rows[rank]["channel"] == "none"
    assert set((logs / "5.log").read_text().split()) <= {"0"}
    assert not (top / "6.log").exists()
    assert "Transfer-Encoding" in rows[7]["error"], rows[7]
    assert "Content-Length" in rows[8]["error"], rows[8]
    assert "an integer of 5000 digits" in rows[9]["error"], rows[9]
    for rank in (7, 8, 9):
        assert rows[rank]["summary"] is None
    json.dumps(doc)  # the answer travels as JSON
    # bounded: the silent and the endless answers each cost one deadline, not forever
    assert took < scaled(15 * timeout), took
