"""The node-side reaper puts each command in a cgroup of its own where the machine allows one.

A cgroup v2 child of the reaper's own cgroup holds the command's whole tree from its first
instruction (the reaper moves itself in, spawns, moves back), so a timeout or Ctrl-C kills
all of it at once (``cgroup.kill``), whatever it did to its parentage; the directory is
removed afterwards. Where no cgroup can be made (no cgroup2, not root) the reaper falls
back to its subreaper and ``/proc`` walk, silently.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from brctl.diagnostics import reaper
from brctl.remote.wrap import wrapped
from tests.integration.cluster import scaled


def _usable_cgroup() -> str | None:
    """Our own cgroup v2 directory when a child can be made in it, else None."""
    where = reaper.own_cgroup()
    if where is None:
        return None
    probe = os.path.join(where, f"brctl-test-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError:
        return None
    os.rmdir(probe)
    return where


def _run(argv: list[str], timeout: float, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, *wrapped(sys.executable, argv, timeout)], capture_output=True,
                          text=True, timeout=scaled(30))


def _alive(pattern: str) -> list[int]:
    rx, found = re.compile(pattern), []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if rx.search(cmdline.decode(errors="replace")):
            found.append(int(entry))
    return found


def _gone(pattern: str) -> bool:
    deadline = time.monotonic() + scaled(3)
    while _alive(pattern) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pattern)


def _command_cgroup(stdout: str) -> str:
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith("0::")]
    return line[3:]


def test_a_command_runs_in_its_own_cgroup_which_is_removed_after() -> None:
    where = _usable_cgroup()
    if where is None:
        pytest.skip("no writable cgroup v2 here: the reaper uses its /proc walk")
    done = _run(["cat", "/proc/self/cgroup"], 10)
    assert done.returncode == 0, done.stderr
    path = _command_cgroup(done.stdout)
    assert re.search(r"/brctl-[0-9a-f]{16}$", path), path
    assert not os.path.exists(os.path.join(reaper.cgroup_root() or "/nonexistent", path.lstrip("/")))


def test_a_timeout_kills_the_whole_cgroup_and_removes_it() -> None:
    if _usable_cgroup() is None:
        pytest.skip("no writable cgroup v2 here: the reaper uses its /proc walk")
    script = "cat /proc/self/cgroup; (setsid sh -c 'sleep 1151 & exit' &); sleep 1152"
    done = _run(["sh", "-c", script], scaled(1))
    assert done.returncode == reaper.TIMEOUT_EXIT, done.stderr
    assert _gone(r"^sleep 115[12]")
    path = _command_cgroup(done.stdout)
    assert not os.path.exists(os.path.join(reaper.cgroup_root() or "/nonexistent", path.lstrip("/")))


def test_what_a_command_leaves_running_is_kept_and_its_cgroup_still_removed() -> None:
    if _usable_cgroup() is None:
        pytest.skip("no writable cgroup v2 here: the reaper uses its /proc walk")
    done = subprocess.run([*wrapped(sys.executable, ["sh", "-c", "cat /proc/self/cgroup; "
                                                     "setsid sleep 1161 >/dev/null 2>&1 &"], 10)],
                          capture_output=True, text=True, timeout=scaled(30))
    try:
        assert done.returncode == 0, done.stderr
        assert _alive(r"^sleep 1161")  # its business, as under plain ssh
        path = _command_cgroup(done.stdout)
        assert not os.path.exists(os.path.join(reaper.cgroup_root() or "/nonexistent", path.lstrip("/")))
    finally:
        for pid in _alive(r"^sleep 1161"):
            os.kill(pid, 9)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_without_a_cgroup_the_walk_still_kills_the_tree() -> None:
    # as nobody, no cgroup can be made: the fallback is silent and kills as before
    script = "(setsid sh -c 'sleep 1171 & exit' &); sleep 1172"
    done = _run(["sh", "-c", script], scaled(1),
                prefix=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"))
    assert done.returncode == reaper.TIMEOUT_EXIT, done.stderr
    assert done.stderr.startswith("brctl: timeout"), done.stderr
    assert _gone(r"^sleep 117[12]")
