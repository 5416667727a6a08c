"""Probe: who and where am I? Python, hostname, CPU count, ``$SSH_CONNECTION``.

Proves that a probe ran on the node it claims (the ssh server address is in
``ssh_connection``) and which code it ran (``brctl_path``).
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

from brctl.diagnostics.protocol import serve


def collect(request: dict[str, Any]) -> dict[str, Any]:
    """The node's identity."""
    import brctl

    return {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "cpus": os.cpu_count(),
        "ssh_connection": os.environ.get("SSH_CONNECTION"),
        "pid": os.getpid(),
        "uid": os.getuid(),  # who the probe ran as (job.user, or the ssh user)
        "cwd": os.getcwd(),
        "brctl_version": brctl.__version__,
        "brctl_path": os.path.dirname(brctl.__file__),
        "echo": request.get("echo"),
    }


if __name__ == "__main__":
    serve(collect)
