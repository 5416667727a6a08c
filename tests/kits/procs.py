"""Processes on this host, for tests that prove a command and all it started are gone."""

from __future__ import annotations

import os
import re
from pathlib import Path


def local_pids(pattern: str) -> list[int]:
    """PIDs on this host whose command line matches regex ``pattern``."""
    rx, found = re.compile(pattern), []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if rx.search(cmdline.decode(errors="replace")):
            found.append(int(entry))
    return found
