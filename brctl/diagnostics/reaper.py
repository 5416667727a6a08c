"""Node side: run one command under a deadline and leave nothing of it behind.

``python3 -I -S -c <this file> SECONDS ARGV...`` (the transports send the source
itself, so no file has to exist on the node). The command runs in its own session;
this process is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so whatever the
command starts stays below it even when it ``setsid``s, double-forks or loses its
parent. It ends the whole tree, all of it found by a walk of ``/proc`` (SIGTERM,
SIGKILL ``GRACE_S`` later, repeated until nothing is left) when:

- the deadline passes: exit 124, whatever the command does with SIGTERM;
- the channel goes away (stdout/stderr's reader closed: Ctrl-C on the
  controller, a lost connection): exit 129;
- this process gets SIGTERM/SIGHUP/SIGINT (the local transport's cancel): 128+sig.

When the command itself exits first, this exits with its status (128+N for a
signal) at once; what it left running in the background is its business, as
under plain ``ssh``. Standard library only; Python >= 3.9; Linux (``/proc``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 2.0
TIMEOUT_EXIT = 124
GONE_EXIT = 129
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def descendants(root: int) -> list[int]:
    """Every live process whose parent chain leads to ``root`` (by one walk of /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2:].split()
        if fields[0] in (b"Z", b"X"):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _reap() -> dict[int, int]:
    """Collect every exited child; return {pid: wait status}."""
    done: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done[pid] = status


def kill_tree(leader: int) -> None:
    """SIGTERM the whole tree below us (and ``leader``'s group), SIGKILL what is left after GRACE_S."""
    me = os.getpid()
    with contextlib.suppress(OSError):
        os.killpg(leader, signal.SIGTERM)
    _signal_all(descendants(me), signal.SIGTERM)
    give_up = time.monotonic() + GRACE_S
    while time.monotonic() < give_up:
        _reap()
        if not descendants(me):
            return
        time.sleep(0.05)
    for _ in range(100):  # a tree that forks while it dies needs a few rounds
        left = descendants(me)
        if not left:
            return
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.01)
        _reap()


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def main(argv: list[str]) -> int:
    seconds, cmd = float(argv[0]), argv[1:]
    deadline = time.monotonic() + seconds
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the walk covers less
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for sig in (signal.SIGCHLD, *_STOP_SIGNALS):
        signal.signal(sig, lambda *_: None)
    try:
        # Python ignores SIGPIPE and SIGXFSZ; the command gets the defaults back.
        leader = os.posix_spawnp(cmd[0], cmd, os.environ, setsid=True,
                                 setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, *_STOP_SIGNALS))
    except OSError as exc:
        sys.stderr.write(f"{cmd[0]}: {exc.strerror}\n")
        return 127
    poller = select.poll()
    poller.register(wake_r, select.POLLIN)
    for fd in (1, 2):
        poller.register(fd, 0)  # only POLLERR/POLLHUP: the reader went away
    reason: int | None = None
    while reason is None:
        left = deadline - time.monotonic()
        if left <= 0:
            reason = TIMEOUT_EXIT
            break
        for fd, events in poller.poll(left * 1000 + 1):
            if fd == wake_r:
                for signum in os.read(wake_r, 512):
                    if signum in _STOP_SIGNALS:
                        reason = 128 + signum
            elif events & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                reason = GONE_EXIT
        status = _reap().get(leader)
        if status is not None:
            return _exit_code(status)
    kill_tree(leader)
    if reason == TIMEOUT_EXIT:
        sys.stderr.write(f"brctl: timeout: killed after {seconds:g}s, with all it started\n")
    return reason


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
