"""The controller-side watcher every ``srun`` runs under: srun must not outlive brctl.

srun runs in a session of its own (a terminal's Ctrl-C is brctl's to handle), so when brctl
dies without its Ctrl-C path (SIGKILL, the OOM killer) nothing would end it, and every
command would run to its own timeout on every node. ``PR_SET_PDEATHSIG`` cannot be used
from Python's ``subprocess`` safely (``preexec_fn`` in a threaded program) and fires when
the forking *thread* ends. So brctl starts ``python3 -I -S -c <this file> FD srun ARGS...``:
it forks srun (same stdin, stdout, stderr) and watches FD, the read end of a pipe whose
only write end brctl holds for its whole life. EOF there means brctl is gone: srun gets
SIGTERM (it cancels its step, and the node-side reapers end the commands), SIGKILL
``STOP_WAIT_S`` later if it lingers. SIGTERM or SIGHUP to the watcher is passed on to srun
(brctl's Ctrl-C path signals the process it started). The watcher ends with srun's own
status (its exit code, or the same signal), so brctl reads srun's outcome unchanged.

Standard library only, no site (``-S``), isolated (``-I``): it runs as root on the
controller, and nothing from the cwd or the environment may be imported into it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

STOP_WAIT_S = 10.0  # after SIGTERM, before SIGKILL (as brctl's own stop)


def main(argv: list[str]) -> None:
    """``FD COMMAND...``: run COMMAND, ended when FD reaches EOF."""
    death, command = int(argv[0]), argv[1:]
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)  # SIGCHLD wakes the poll below: no polling interval
    signal.signal(signal.SIGCHLD, lambda *_: None)
    pid = os.fork()
    if pid == 0:
        os.close(death)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(2, f"{command[0]}: {exc.strerror}\n".encode())
        os._exit(127)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: _signal(pid, signal.SIGTERM))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # brctl decides what a Ctrl-C does
    poll = select.poll()
    poll.register(death, select.POLLIN)
    poll.register(wake_r, select.POLLIN)
    stop_at = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        now = time.monotonic()
        if stop_at is not None and now >= stop_at:
            _signal(pid, signal.SIGKILL)
            stop_at = now + 3600.0
        timeout = None if stop_at is None else max(0.0, stop_at - now)
        for fd, _ in poll.poll(None if timeout is None else int(timeout * 1000) + 1):
            if fd == wake_r:
                os.read(wake_r, 512)
            elif stop_at is None:  # EOF (or a stray byte): brctl is gone
                poll.unregister(death)
                _signal(pid, signal.SIGTERM)
                stop_at = time.monotonic() + STOP_WAIT_S
    if os.WIFSIGNALED(status):  # the same death as srun's
        died = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(died, signal.SIG_DFL)
        os.kill(os.getpid(), died)
        os._exit(128 + died)
    os._exit(os.waitstatus_to_exitcode(status))


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


if __name__ == "__main__":
    main(sys.argv[1:])
