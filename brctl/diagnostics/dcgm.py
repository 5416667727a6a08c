"""Probe: run NVIDIA DCGM's diagnostic (``dcgmi diag -r LEVEL -j``) on this machine.

Returns dcgmi's exit code and JSON output as they are; the controller parses them
(``brctl.analysis.diagnose.stages.parse_dcgm``). No ``dcgmi`` on PATH → ``skipped``
with that reason. Node-side, standard library.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from typing import Any

from brctl.diagnostics.isolate import vetted
from brctl.diagnostics.protocol import serve


def run_diag(request: dict[str, Any]) -> dict[str, Any]:
    """Run ``dcgmi diag`` at ``level`` within ``timeout`` seconds."""
    level = str(request.get("level", "1"))
    timeout = float(request.get("timeout", 900))
    exe = vetted(shutil.which("dcgmi"))
    if exe is None:
        return {"skipped": "dcgmi not found on PATH: install DCGM to run the EUD/diag stage"}
    argv = [exe, "diag", "-r", level, "-j"]
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # nvvs runs as a child of dcgmi: kill the group
        proc.communicate()
        return {"argv": argv, "timed_out": True, "seconds": time.monotonic() - start}
    return {
        "argv": argv,
        "exit_code": proc.returncode,
        "stdout": out.decode("utf-8", errors="replace"),
        "stderr": err.decode("utf-8", errors="replace")[-2000:],
        "seconds": time.monotonic() - start,
    }


if __name__ == "__main__":
    serve(run_diag)
