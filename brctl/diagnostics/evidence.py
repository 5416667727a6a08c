"""Probe: the evidence of a failed job on this machine.

Tails of the job's logs (``log_paths`` globs; files of root, of their directory's
owner or of ``job_user``, the inventory's ``job.user``), kernel log lines that
mention an NVIDIA Xid, and the training processes still alive (``process_match``
on the command line; this probe and its ancestors excluded). Node-side, standard
library.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from typing import Any

from brctl.diagnostics import safefs
from brctl.diagnostics.isolate import vetted
from brctl.diagnostics.protocol import serve

_TAIL_BYTES_PER_LINE = 512  # read this much per wanted line from the end of a log
_MAX_FILES = 64  # a glob that matches thousands of files is a configuration mistake


def tail(path: str, lines: int, job_uid: int | None = None) -> list[str]:
    """The last ``lines`` lines of the job's file ``path`` (decoded leniently).

    Opened as ``safefs.open_job_file`` does: a symlink anywhere on the path, or a
    file neither root's nor its directory owner's nor ``job_uid``'s, raises
    ``OSError``: a job log linked to a root-only file is reported, never shipped.
    """
    with os.fdopen(safefs.open_job_file(os.path.abspath(path), job_uid), "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        start = max(0, size - lines * _TAIL_BYTES_PER_LINE)
        fh.seek(start)
        data = fh.read(size - start)  # not to EOF: a job writing fast would grow the read
    return data.decode("utf-8", errors="replace").splitlines()[-lines:]


def _logs(patterns: list[str], lines: int, job_uid: int | None = None
          ) -> tuple[dict[str, list[str]], list[str]]:
    found: dict[str, list[str]] = {}
    errors: list[str] = []
    for pattern in patterns:
        paths = sorted(glob.glob(os.path.expanduser(pattern)))[:_MAX_FILES]
        for path in paths:
            try:
                found[path] = tail(path, lines, job_uid)
            except OSError as exc:
                errors.append(f"{path}: {exc.strerror}")
    return found, errors


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def live_processes(pattern: str) -> list[dict[str, Any]]:
    """Processes whose command line matches ``pattern`` (not this probe or its parents)."""
    rx = re.compile(pattern)
    skip = _ancestors()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode("utf-8", errors="replace").strip()
        except OSError:
            continue
        if cmd and rx.search(cmd):
            out.append({"pid": int(entry), "cmdline": cmd[:200]})
    return out


def kernel_xid_lines(timeout: float = 10.0) -> tuple[list[str], str | None]:
    """Kernel log lines that mention an Xid (``dmesg``), or why they could not be read."""
    exe = vetted(shutil.which("dmesg"))
    if exe is None:
        return [], "dmesg: not found on PATH"
    try:
        proc = subprocess.run([exe], capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"dmesg: {exc}"
    if proc.returncode != 0:
        return [], f"dmesg exited {proc.returncode}: {proc.stderr.decode(errors='replace').strip()[:200]}"
    text = proc.stdout.decode("utf-8", errors="replace")
    return [ln for ln in text.splitlines() if "Xid" in ln], None


def collect(request: dict[str, Any]) -> dict[str, Any]:
    """Logs, Xid lines and live training processes of this machine."""
    logs, errors = _logs(list(request.get("log_paths", [])), int(request.get("tail_lines", 400)),
                         safefs.job_uid(request.get("job_user")))
    xid_lines, kernel_error = kernel_xid_lines()
    match = request.get("process_match")
    return {
        "logs": logs,
        "log_errors": errors,
        "xid_lines": xid_lines,
        "kernel_error": kernel_error,
        "processes": live_processes(match) if match else [],
    }


if __name__ == "__main__":
    serve(collect)
