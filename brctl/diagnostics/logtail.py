"""Probe: the tails of the training job's log files on this machine.

Request: ``{"paths": [glob, ...], "bytes": N, "files": K, "job_user": name}``. For
each glob the newest ``K`` matching files are read from their last ``N`` bytes (a
partial first line is dropped). The files belong to the job, so they are opened as
``safefs.open_job_file`` does: no symlink followed anywhere on the path, only
files of root, of their directory's owner or of ``job_user`` (the inventory's
``job.user``, optional), never a hard link to someone else's file; a refused file
is listed with its ``error`` instead of a tail. The controller extracts the step with
``daemon.progress_regex`` (brctl.analysis.daemon): the node ships text, not verdicts,
so changing the regex never needs new node-side code. Standard library only.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from brctl.diagnostics import safefs
from brctl.diagnostics.protocol import serve


def _tail(fd: int, size: int) -> str:
    with os.fdopen(fd, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        end = fh.tell()
        start = max(0, end - size)
        fh.seek(start)
        data = fh.read(size)
    if start > 0 and b"\n" in data:
        data = data.split(b"\n", 1)[1]  # the first line was cut by the seek
    return data.decode("utf-8", errors="replace")


def collect(request: dict[str, Any]) -> dict[str, Any]:
    """Tails of the newest files matching each glob in ``paths``."""
    size = int(request.get("bytes", 16384))
    keep = int(request.get("files", 2))
    uid = safefs.job_uid(request.get("job_user"))
    files = []
    for pattern in request.get("paths", []):
        found = []
        for path in glob.glob(os.path.abspath(os.path.expanduser(str(pattern)))):
            try:
                found.append((os.lstat(path).st_mtime, path))
            except OSError:
                continue  # rotated away between glob and stat
        for mtime, path in sorted(found, reverse=True)[:keep]:
            try:  # the job owns these files: no link followed, no root file read
                files.append({"path": path, "mtime": mtime,
                              "tail": _tail(safefs.open_job_file(path, uid), size)})
            except OSError as exc:
                files.append({"path": path, "mtime": mtime, "error": exc.strerror or str(exc)})
    return {"files": files}


if __name__ == "__main__":
    serve(collect)
