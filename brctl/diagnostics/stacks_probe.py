"""Probe: find the training processes on this machine and dump their stacks with py-spy.

Node-side; standard library only. Request::

    {"process_match": REGEX, "py_spy": PATH|null, "dump_timeout": SECONDS,
     "concurrency": N, "only_ranks": [RANK, ...] | null, "raw": BOOL,
     "recorder": {"timeout": SECONDS, "k": N} | null}

1. Processes whose command line matches ``process_match`` (never this probe or
   its ancestors: the ssh session's command line holds the request) and all their
   descendants form the job's process tree.
2. Each one's ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` are read from
   ``/proc/PID/environ``; no other environment value is kept, so secrets never
   leave the node. A process with RANK whose parent has none is a rank; one whose
   parent has RANK too (data-loader, checkpoint workers) is reported under its
   rank; one without RANK is the launcher; one whose environment is refused (no
   ptrace rights: the same kernel check as py-spy's) is ``unread``, never a launcher.
3. Every rank is dumped with ``py-spy dump --json --pid PID``, each under its
   own timeout, several at once. A failure says why, and for ptrace failures
   which permission is missing.
3b. With ``recorder``, each rank's socket (``brctl.job``'s, or its own
   ``TORCH_WORKER_SERVER_SOCKET``) is read first (``rank_socket``): the flight
   recorder reduced to its summary (``recorder.summarise``), brctl's group table,
   whether a traceback came; a process whose environment was refused gets its rank
   from its socket. The answer's ``recorder`` lists every rank's ``channel``,
   ``state`` (read / unread / unresponsive), ``proc_state`` and ``summary``;
   ``unread`` counts processes still without a rank; ``socket_errors`` says what
   was refused (a directory, a socket whose peer is not the job); with ``raw``,
   ``fr_raw`` holds each rank's dump as it came, with its clock and table (``--save``).
4. Each dump is reduced to what the analysis needs (``pyspy_frames``): the main
   thread's normalised frames, as indices into one frame table per machine, and
   the ranks packed into a few strings (``pyspy_frames.pack``: format
   ``PACKED``). A dump whose output is not py-spy's JSON becomes an error. With
   ``raw`` (``brctl stacks --save``) the answer is format ``RAW``: the process rows
   and py-spy's JSON per dump as it printed it (``output``).

py-spy comes from the request (the copy the controller shipped), else PATH, else
next to this Python; when there is none the answer says ``py_spy_missing`` and
the controller ships its own and asks again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from brctl.diagnostics.isolate import vetted
from brctl.diagnostics.protocol import serve
from brctl.diagnostics.pyspy_frames import (
    PACKED,
    RAW,
    PySpyFormatError,
    RawFrame,
    main_frames,
    pack,
)
from brctl.diagnostics.rank_socket import read_job, record

RANK_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")  # the only environment values read
_STATES = {"D": "uninterruptible sleep (D): stuck in the kernel, e.g. on a device or NFS",
           "T": "stopped (T): another tracer or a debugger holds it",
           "t": "stopped by a tracer (t): another debugger (gdb, py-spy) is attached",
           "Z": "zombie (Z): it exited and its parent has not reaped it"}


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _stat(pid: int) -> tuple[int, str] | None:
    """(ppid, state letter) from /proc/PID/stat (the comm field may hold spaces and ')')."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    rest = raw.decode("utf-8", "replace").rsplit(")", 1)[-1].split()
    return int(rest[1]), rest[0]


def _rank_env(pid: int) -> dict[str, int] | None:
    """The RANK-like keys of a process's environment as ints (None: unreadable)."""
    raw = _read(f"/proc/{pid}/environ")
    if raw is None:
        return None
    out: dict[str, int] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        name = key.decode("ascii", "replace")
        if sep and name in RANK_KEYS:
            try:
                out[name] = int(value)
            except ValueError:
                continue  # a non-numeric RANK is not a rank; its value is never echoed
    return out


def _ancestors(pid: int) -> set[int]:
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        st = _stat(pid)
        if st is None:
            break
        pid = st[0]
    return out


def find_processes(pattern: str) -> list[dict[str, Any]]:
    """The matching processes and their descendants, each with its role and rank."""
    regex = re.compile(pattern)
    mine = _ancestors(os.getpid())
    table: dict[int, tuple[int, str]] = {}
    matched: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        st = _stat(pid)
        cmd = _read(f"/proc/{pid}/cmdline")
        if st is None or cmd is None:
            continue  # exited while we looked
        table[pid] = st
        line = cmd.replace(b"\0", b" ").decode("utf-8", "replace").strip()
        if pid not in mine and line and regex.search(line):
            matched.add(pid)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = set(), list(matched)
    while todo:
        pid = todo.pop()
        if pid in tree or pid in mine:
            continue
        tree.add(pid)
        todo.extend(children.get(pid, []))
    envs = {pid: _rank_env(pid) for pid in tree}
    procs = []
    for pid in sorted(tree):
        ppid = table[pid][0]
        env = envs[pid] or {}
        parent_env = envs.get(ppid) or {}
        if envs[pid] is None:
            role = "unread"  # its RANK is unknown, not absent: never taken for the launcher
        elif "RANK" not in env:
            role = "launcher"
        elif "RANK" in parent_env:
            role = "worker"
        else:
            role = "rank"
        # only what the controller reads: 16,384 machines' answers are parsed in one go
        procs.append({"pid": pid, "role": role, "rank": env.get("RANK"),
                      "local_rank": env.get("LOCAL_RANK"), "world_size": env.get("WORLD_SIZE")})
    return procs


def find_py_spy(requested: str | None) -> str | None:
    """py-spy to use: the shipped copy, else PATH, else beside this interpreter (``vetted``:
    it runs as root with ptrace rights over the job)."""
    if requested and os.access(requested, os.X_OK):
        return vetted(requested)
    found = shutil.which("py-spy")
    if found:
        return vetted(found)
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return vetted(beside) if os.access(beside, os.X_OK) else None


def _ptrace_scope() -> str | None:
    raw = _read("/proc/sys/kernel/yama/ptrace_scope")
    return raw.decode().strip() if raw is not None else None


def explain_failure(pid: int, stderr: str) -> str:
    """Why py-spy could not dump ``pid``, naming the missing permission when it is one."""
    tail = " ".join(stderr.strip().splitlines()[-2:])[:300]
    st = _stat(pid)
    if st is None:
        return f"process {pid} exited before it could be dumped ({tail})"
    low = stderr.lower()
    if "permission denied" in low or "operation not permitted" in low or "eperm" in low:
        scope = _ptrace_scope()
        why = (f"py-spy may not ptrace process {pid}: run brctl's probes as root or give them "
               "CAP_SYS_PTRACE (containers: --cap-add SYS_PTRACE; Kubernetes: "
               "securityContext.capabilities.add [SYS_PTRACE])")
        if scope not in (None, "0"):
            why += f"; kernel.yama.ptrace_scope is {scope} (0 lets a same-user process attach)"
        return f"{why} ({tail})"
    state = _STATES.get(st[1])
    return f"py-spy failed on process {pid}" + (f", which is {state}" if state else "") + f": {tail}"


def _tracer(pid: int) -> int:
    raw = _read(f"/proc/{pid}/status") or b""
    for line in raw.decode("utf-8", "replace").splitlines():
        if line.startswith("TracerPid:"):
            return int(line.split()[1] or 0)
    return 0


def dump(py_spy: str, pid: int, timeout: float, retry: bool = True) -> dict[str, Any]:
    """One ``py-spy dump --json`` with its own timeout (py-spy is killed when it overruns).

    A failure is retried once after a short pause: a process can be attached by
    only one tracer at a time, and another dump of it may just be finishing.
    """
    start = time.monotonic()
    argv = [py_spy, "dump", "--json", "--pid", str(pid)]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        st = _stat(pid)
        state = _STATES.get(st[1], "") if st else "gone"
        return {"pid": pid, "output": None, "seconds": round(time.monotonic() - start, 3),
                "error": f"py-spy did not finish within {timeout:g}s on process {pid}"
                         + (f" ({state})" if state else "")}
    except OSError as exc:
        return {"pid": pid, "output": None, "seconds": 0.0,
                "error": f"cannot run {py_spy}: {exc.strerror}"}
    out = proc.stdout.decode("utf-8", "replace")
    err = proc.stderr.decode("utf-8", "replace")
    seconds = round(time.monotonic() - start, 3)
    if proc.returncode != 0 or not out.lstrip().startswith("["):
        if retry and _stat(pid) is not None:
            time.sleep(0.3)
            return dump(py_spy, pid, timeout, retry=False)
        tracer = _tracer(pid)
        if tracer:
            return {"pid": pid, "output": None, "seconds": seconds,
                    "error": f"process {pid} is already traced by pid {tracer} (a debugger or "
                             "another py-spy); py-spy cannot attach"}
        return {"pid": pid, "output": None, "seconds": seconds,
                "error": explain_failure(pid, err or out)}
    return {"pid": pid, "output": out, "seconds": seconds, "error": None}


def main_stacks(dumps: list[dict[str, Any]]) -> dict[int, list[RawFrame] | str]:
    """pid → its dump's main-thread frames, or why there are none.

    py-spy's text is dropped: it is what made a round of 131,072 ranks ship
    gigabytes. A dump that is not py-spy's JSON keeps only the reason.
    """
    out: dict[int, list[RawFrame] | str] = {}
    for d in dumps:
        pid, text = d["pid"], d["output"]
        if text is None:
            out[pid] = d["error"] or "py-spy gave no output"
            continue
        try:
            out[pid] = main_frames(text, pid)
        except PySpyFormatError as exc:
            out[pid] = f"unusable py-spy output: {exc}"
    return out


def collect(request: dict[str, Any]) -> dict[str, Any]:
    """Find the job's processes, read their sockets and dump every rank (reduced to frames
    unless ``raw``)."""
    pattern = request.get("process_match")
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("request.process_match: a regular expression is required")
    timeout = float(request.get("dump_timeout") or 10.0)
    procs = find_processes(pattern)
    py_spy = find_py_spy(request.get("py_spy"))
    doc: dict[str, Any] = {"py_spy": py_spy, "py_spy_missing": py_spy is None}
    only = request.get("only_ranks")  # machines sharing one kernel: dump only our own ranks
    options = request.get("recorder")
    sockets = read_job(procs, options, only if isinstance(only, list) else None
                       ) if isinstance(options, dict) else None
    for p in procs:
        if sockets is not None and p["pid"] in sockets["found"]:
            p.update(role="rank", rank=sockets["found"][p["pid"]])  # told by its socket
    ranks = [p["pid"] for p in procs if p["role"] == "rank"
             and (not isinstance(only, list) or p["rank"] in only)]
    dumps: list[dict[str, Any]] = []
    if py_spy is not None and ranks:
        workers = max(1, min(int(request.get("concurrency") or 8), len(ranks)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            dumps = list(pool.map(lambda pid: dump(py_spy, pid, timeout), ranks))
    stacks = main_stacks(dumps)
    if sockets is not None:
        doc.update(_recorder_fields(procs, ranks, stacks, sockets, options or {},
                                    bool(request.get("raw"))))
    if request.get("raw"):
        return {**doc, "format": RAW, "processes": procs, "dumps": dumps}
    return {**doc, "format": PACKED, **pack(procs, stacks)}


RAW_FR_MAX = 3 << 20  # raw dumps one answer carries for --save (the answer's cap is 4 MiB)


def _recorder_fields(procs: list[dict[str, Any]], ranks: list[int],
                     stacks: dict[int, list[RawFrame] | str], sockets: dict[str, Any],
                     options: dict[str, Any], raw: bool) -> dict[str, Any]:
    """The answer's ``recorder``, ``unread``, ``socket_errors`` (and ``fr_raw``) fields."""
    rank_of = {p["pid"]: p["rank"] for p in procs}
    readings = sockets["readings"]
    k = int(options.get("k") or 20)
    rows = []
    for pid in ranks:
        got = stacks.get(pid)
        rows.append(record(readings.get(pid), rank_of[pid], pid, k=k,
                           stack=isinstance(got, list),
                           dump_error=got if isinstance(got, str) else None))
    errors = list(sockets["errors"])
    local = {row["rank"]: row for row in rows}
    for bad in sockets["refused"]:
        row = local.get(bad.rank)
        why = f"rank-{bad.rank}.sock: " + "; ".join(bad.errors)
        if row is not None:
            row["error"] = "; ".join(x for x in (row["error"], why) if x)[:600]
        else:
            errors.append(why[:600])
    out: dict[str, Any] = {"recorder": rows, "socket_errors": errors[:64],
                           "unread": sum(p["role"] == "unread" for p in procs)}
    if raw:
        kept: dict[str, Any] = {}
        size = 0
        for pid in ranks:
            r = readings.get(pid)
            if r is not None and r.raw is not None and size + len(r.raw) <= RAW_FR_MAX:
                # what --from needs to summarise it again: the clock it was read on, the table
                kept[str(pid)] = {"dump": r.raw.decode("utf-8", "replace"), "clock_ns": r.clock_ns,
                                  "table": r.table if type(r.table) is dict else None}
                size += len(r.raw)
        out["fr_raw"] = kept
    return out


if __name__ == "__main__":
    serve(collect)
