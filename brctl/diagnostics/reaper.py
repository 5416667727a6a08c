"""Node side: run one command under a deadline and leave nothing of it behind.

``python3 -I -S -c <this file> SECONDS ARGV...`` (the transports send the source
itself, so no file has to exist on the node). The command runs in its own session.
Where the machine allows one (cgroup v2, writable: root; on a v1-only machine, at the
root of v1's freezer hierarchy), it runs in a cgroup of its own,
``brctl-<deadline>-<random>`` below this process's: the reaper moves itself in,
spawns the command and moves back, so the cgroup holds the whole tree from its first
instruction, whatever it does to its parentage (``setsid``, double forks), and is
removed when the reaper ends (what a command that exited left running is moved back
out first). The deadline in the name is on the clock every process on the machine
shares and nothing sets (``CLOCK_BOOTTIME``): a reaper killed with SIGKILL (the OOM
killer, ``pkill -9 python3``) can end nothing, so every reaper's start ends what a
cgroup ``ORPHAN_S`` past its deadline still holds and removes it (a live reaper has
ended its tree and removed its cgroup long before: its deadline is on the same clock,
looked at every ``WAKE_S`` even across a suspend), beside its own or, on a systemd
machine, in the user's other session scopes. Where none can be made, this process
is a child subreaper (``PR_SET_CHILD_SUBREAPER``) instead, so whatever the command
starts stays below it even when it ``setsid``s or loses its parent. It ends the
whole tree, found by a walk of ``/proc`` and in that cgroup (SIGTERM, SIGKILL
``GRACE_S`` later, with ``cgroup.kill`` where the kernel has it, repeated until
nothing is left: in the cgroup, until its ``cgroup.events`` says it is no longer
populated, in v1 until it lists no live process) when:

- the deadline passes: exit 124, whatever the command does with SIGTERM;
- the channel goes away (stdout/stderr's reader closed: Ctrl-C on the
  controller, a lost connection): exit 129;
- this process gets SIGTERM/SIGHUP/SIGINT (the local transport's cancel): 128+sig.

When the command itself exits first, this exits with its status (128+N for a
signal) at once; what it left running in the background is its business, as
under plain ``ssh``. Standard library only; Python >= 3.9; Linux (``/proc``).

Over ssh, where a cgroup can be made, the shell start (``brctl.remote.wrap.START``)
does the set-up instead, without an interpreter, and runs this file only as
``--watch SECONDS STARTED CGROUP`` once the command has run a second (deadline and
lost channel, the same kill) and as ``--sweep PARENT`` where it saw an overdue cgroup.

It runs before every command a node is given, so it starts lean: the C ``_signal``
(``signal`` imports ``enum``), no ``contextlib``, and ``ctypes`` (for the subreaper
``prctl``) only where no cgroup could be made: ~5, ~4 and ~4 ms of node CPU each.
"""

# ruff: noqa: SIM105  (try/except/pass, not contextlib.suppress: see "starts lean" above)
from __future__ import annotations

import os
import select
import sys
import time

TYPE_CHECKING = False  # typing's own costs ~7 ms to import; mypy reads any TYPE_CHECKING
if TYPE_CHECKING:
    import signal
else:
    try:
        import _signal as signal
    except ImportError:  # an interpreter without the C module's own name
        import signal

PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 2.0
TIMEOUT_EXIT = 124
GONE_EXIT = 129
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


CGROUP_PREFIX = "brctl-"


def _mount(fstype: str, option: str = "") -> str | None:
    """Where a ``fstype`` hierarchy (with ``option`` among its mount options) is mounted
    with its root as this process sees it, or None. Any user may mount (FUSE) at a path
    of any bytes, which mountinfo shows as they are: read as a path is (not strict UTF-8,
    which made every reaper crash before its command ran)."""
    try:
        with open("/proc/self/mountinfo", errors="surrogateescape") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, fs = left.split(), right.split()
                if (fs[:1] == [fstype] and len(fields) > 4 and fields[3] == "/"
                        and (not option or option in fs[-1].split(","))):
                    return _unescaped(fields[4])
    except (OSError, ValueError):  # a line the kernel never writes: no cgroup, never a crash
        pass
    return None


def _unescaped(field: str) -> str:
    """A mountinfo path as it is: the kernel writes a space, tab, newline and backslash
    in it as ``\\ooo`` (``\\040``)."""
    head, *rest = field.split(chr(92))  # a backslash; fish, as a login shell, reads two as one
    return head + "".join(chr(int(part[:3], 8)) + part[3:] for part in rest)


def cgroup_root() -> str | None:
    """Where cgroup v2 is mounted with its root as this process sees it, or None."""
    return _mount("cgroup2")


def own_cgroup() -> str | None:
    """The cgroup directory this process's commands get theirs in, or None: its own in
    cgroup v2; on a machine without cgroup v2 (v1 only: RHEL 8's default), the root of
    v1's freezer hierarchy, which systemd leaves alone, if this process is there (a
    freezer cgroup below the root is someone's tracking, a Slurm step or a container:
    a command moved out of it would hide from it)."""
    try:
        with open("/proc/self/cgroup", errors="surrogateescape") as f:  # a path, as mountinfo's
            lines = f.read().splitlines()
    except OSError:
        return None
    paths = {}  # controller ("" in v2) -> this process's path in its hierarchy
    for line in lines:
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        for name in controllers.split(","):
            paths[name] = path
    root = cgroup_root()
    if root is None:
        return _mount("cgroup", "freezer") if paths.get("freezer") == "/" else None
    path = paths.get("", "")
    if not path.startswith("/"):
        return None
    full = os.path.join(root, path[1:])
    return full if os.path.isdir(full) else None


def _move(pid: int, cgroup: str) -> bool:
    try:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(pid))
    except OSError:
        return False
    return True


def _enter_cgroup(seconds: float) -> tuple[str, str] | None:
    """A new cgroup with this process in it: (the one it came from, the new one), or None.

    Its name says when the command must be over, ``seconds`` from now on the shared clock."""
    parent = own_cgroup()
    if parent is None:
        return None
    _sweep(parent)
    due = int(now() + seconds) + 1
    mine = os.path.join(parent, f"{CGROUP_PREFIX}{due}-{os.urandom(8).hex()}")
    try:
        os.mkdir(mine)
    except OSError:
        return None
    if _move(os.getpid(), mine):
        return parent, mine
    try:
        os.rmdir(mine)
    except OSError:
        pass
    return None


def members(cgroup: str | None) -> list[int]:
    """The live processes in ``cgroup`` (none for None)."""
    if cgroup is None:
        return []
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            pids = [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []
    return [pid for pid in pids if _live(pid, _state(pid))]


def populated(cgroup: str) -> bool | None:
    """Whether anything still runs in ``cgroup`` (``cgroup.events``), or None: unreadable."""
    try:
        with open(os.path.join(cgroup, "cgroup.events")) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "populated":
                    return value.strip() != "0"
    except OSError:
        pass
    return None


def _state(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return b""
    return stat[stat.rfind(b")") + 2:][:1]


def _live(pid: int, state: bytes) -> bool:
    """Whether ``pid``, in ``state`` (``/proc/PID/stat``'s field, b"" if gone), still runs.

    A thread-group leader that called ``pthread_exit`` shows ``Z`` while its other
    threads run on: alive. A real zombie has no thread left but itself in ``task``."""
    if state == b"":
        return False
    if state not in (b"Z", b"X"):
        return True
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


ORPHAN_S = 30.0  # past its deadline by this much, a cgroup has outlived its reaper
SWEEP_AGE_S = 60.0  # a cgroup named without a deadline (older brctl) and younger: kept
WAKE_S = 10.0  # the longest wait between two looks at the clock (it may jump: a suspend)
MAX_S = 10 * 365 * 86400.0  # a longer (or no number) timeout is this: poll() takes ~24 days
_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def now() -> float:
    """The reaper's one clock: CLOCK_BOOTTIME on Linux, shared by every process, set by
    nothing, and counting through a suspend (CLOCK_MONOTONIC, which Python's monotonic
    reads, stops then), so a cgroup's name and its reaper agree when it is overdue."""
    return time.clock_gettime(_CLOCK)


def _due(name: str) -> int | None:
    """The deadline a reaper's cgroup ``name`` carries, 0 for an older reaper's name
    without one (``brctl-<16 hex>``), None for a name that is not a reaper's."""
    if not name.startswith(CGROUP_PREFIX):
        return None
    head, _, tag = name[len(CGROUP_PREFIX):].rpartition("-")
    if len(tag) != 16 or tag.strip("0123456789abcdef"):
        return None
    if not head:
        return 0
    return int(head) if head.isascii() and head.isdigit() else None  # not '٣', '²'


def _sweep(parent: str) -> None:
    """End what reapers killed with SIGKILL left behind, without ever waiting on it.

    A cgroup ``ORPHAN_S`` past its deadline has outlived its reaper: what it holds is
    killed (a live reaper kills at the deadline and removes its cgroup within seconds)
    and it is removed, by this sweep or, while its dead are still exiting, the next
    one. One not yet due is a live reaper's, entered or about to be: left alone. A name
    without a deadline (an older brctl's) is removed only when empty and ``SWEEP_AGE_S``
    old, since its reaper may be alive."""
    at, stale = now(), time.time() - SWEEP_AGE_S
    for place in _sweep_places(parent):
        try:
            names = os.listdir(place)
        except OSError:
            continue
        for name in names:
            due = _due(name)
            if due is None or (due > 0 and at < due + ORPHAN_S):
                continue
            path = os.path.join(place, name)
            try:
                if due:
                    _kill_cgroup(path)
                elif os.stat(path).st_mtime >= stale:
                    continue
                os.rmdir(path)
            except OSError:
                pass


def _sweep_places(parent: str) -> list[str]:
    """Where dead reapers' cgroups may be: ``parent``, and, where it is a logind session
    (``session-N.scope``), every session scope beside it: on systemd machines each ssh
    connection is a session of its own, so a later command never shares the parent of
    one whose reaper was killed (the scope lingers while its orphans run)."""
    name = os.path.basename(parent)
    if not (name.startswith("session-") and name.endswith(".scope")):
        return [parent]
    user = os.path.dirname(parent)
    try:
        return [parent, *(os.path.join(user, n) for n in os.listdir(user)
                          if n != name and n.startswith("session-") and n.endswith(".scope"))]
    except OSError:
        return [parent]


def _leave_cgroup(cgroup: tuple[str, str]) -> None:
    """Move what is still in the command's cgroup back to ``parent`` and remove it."""
    parent, mine = cgroup
    for _ in range(50):
        for pid in members(mine):
            _move(pid, parent)
        try:
            os.rmdir(mine)
            return
        except FileNotFoundError:
            return  # another reaper's sweep took it once it was empty
        except OSError:
            time.sleep(0.02)  # exiting processes leave a cgroup a moment after they die


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
        if not _live(int(entry), fields[0]):
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
        try:
            os.kill(pid, sig)
        except OSError:
            pass


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


def _below(root: int | None) -> list[int]:
    """What the walk finds below ``root`` (this process where None), never this process."""
    me = os.getpid()
    return [pid for pid in descendants(me if root is None else root) if pid != me]


def _tree(cgroup: str | None, root: int | None = None) -> list[int]:
    return sorted(set(_below(root)) | set(members(cgroup)) - {os.getpid()})


def _anything_left(cgroup: str | None, root: int | None = None) -> bool:
    """Whether any of the tree still runs: below ``root`` (us) by the walk, or in ``cgroup``
    as its ``cgroup.events`` says (what the kernel counts, whatever /proc shows of each pid)."""
    if _below(root):
        return True
    if cgroup is None:
        return False
    busy = populated(cgroup)
    return bool(members(cgroup)) if busy is None else busy


def kill_tree(leader: int | None, cgroup: str | None = None, root: int | None = None) -> None:
    """SIGTERM the whole tree below ``root`` (us) (and ``leader``'s group, and ``cgroup``), SIGKILL
    what is left after GRACE_S (``cgroup.kill``: all of it at once, forks in flight too).

    ``cgroup.kill`` is written at least once, and every pid found live SIGKILLed, even
    when nothing seems left once the grace period ends: what neither the walk nor the
    cgroup's pid list shows as live must not survive a kill that reports success."""
    if leader is not None:
        try:
            os.killpg(leader, signal.SIGTERM)
        except OSError:
            pass
    _signal_all(_tree(cgroup, root), signal.SIGTERM)
    give_up = now() + GRACE_S
    while now() < give_up:
        _reap()
        if not _anything_left(cgroup, root):
            break
        time.sleep(0.05)
    for _ in range(100):  # a tree that forks while it dies needs a few rounds
        if cgroup is not None:
            _kill_cgroup(cgroup)
        _signal_all(_below(root), signal.SIGKILL)
        time.sleep(0.01)
        _reap()
        if not _anything_left(cgroup, root):
            return


def _kill_cgroup(cgroup: str) -> None:
    """SIGKILL all ``cgroup`` holds: at once, forks in flight too, with ``cgroup.kill``
    (Linux 5.14+), and each member it lists, for older kernels."""
    try:
        with open(os.path.join(cgroup, "cgroup.kill"), "w") as f:
            f.write("1")
    except OSError:
        pass
    _signal_all(members(cgroup), signal.SIGKILL)


def _become_subreaper() -> None:
    """Keep every orphan of the command below us (``PR_SET_CHILD_SUBREAPER``) for the walk."""
    try:
        import ctypes  # here, not at the top: most commands run in a cgroup and never need it

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (ImportError, OSError, AttributeError):  # not Linux: the walk covers less
        pass


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _bounded(seconds: float) -> float:
    return seconds if seconds < MAX_S else MAX_S  # inf, nan, 1e300: no arithmetic may overflow


def main(argv: list[str]) -> int:
    if argv[0] == "--watch":
        return watch(float(argv[1]), float(argv[2]), argv[3], int(argv[4]))
    if argv[0] == "--sweep":
        _sweep(argv[1])
        return 0
    seconds, cmd = _bounded(float(argv[0])), argv[1:]
    deadline = now() + seconds
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for sig in (signal.SIGCHLD, *_STOP_SIGNALS):
        signal.signal(sig, lambda *_: None)
    cgroup = _enter_cgroup(seconds)
    if cgroup is None:
        _become_subreaper()  # the cgroup holds the tree where there is one; else the walk must
    try:
        # Python ignores SIGPIPE and SIGXFSZ; the command gets the defaults back.
        leader = os.posix_spawnp(cmd[0], cmd, os.environ, setsid=True,
                                 setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, *_STOP_SIGNALS))
    except OSError as exc:
        sys.stderr.write(f"{cmd[0]}: {exc.strerror}\n")
        leader = None
    if cgroup is not None and not _move(os.getpid(), cgroup[0]):
        # Stuck in it with the command: never kill it whole (cgroup.kill would end us
        # too); the walk does, and from now on sees what is orphaned.
        _become_subreaper()
        cgroup = None
    try:
        return 127 if leader is None else _supervise(leader, deadline, seconds, wake_r,
                                                     None if cgroup is None else cgroup[1])
    finally:
        if cgroup is not None:
            _leave_cgroup(cgroup)


def _supervise(leader: int, deadline: float, seconds: float, wake_r: int, cgroup: str | None) -> int:
    """Wait for the command, the deadline, a lost reader or a stop signal; the exit code."""
    poller = select.poll()
    poller.register(wake_r, select.POLLIN)
    for fd in (1, 2):
        poller.register(fd, 0)  # only POLLERR/POLLHUP: the reader went away
    reason: int | None = None
    while reason is None:
        left = deadline - now()
        if left <= 0:
            reason = TIMEOUT_EXIT
            break
        for fd, events in poller.poll(min(left, WAKE_S) * 1000 + 1):
            if fd == wake_r:
                for signum in os.read(wake_r, 512):
                    if signum in _STOP_SIGNALS:
                        reason = 128 + signum
            elif events & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                reason = GONE_EXIT
        status = _reap().get(leader)
        if status is not None:
            return _exit_code(status)
    kill_tree(leader, cgroup)
    if reason == TIMEOUT_EXIT:
        sys.stderr.write(f"brctl: timeout: killed after {seconds:g}s, with all it started\n")
    return reason


def watch(seconds: float, started: float, cgroup: str, shell: int) -> int:
    """Watch a command the shell start (``brctl.remote.wrap.START``, process ``shell``) put
    in ``cgroup``, which started at ``started`` on ``now()``'s clock and may run
    ``seconds``: end it whole when the deadline passes (124) or the channel goes away
    (129), as ``main`` does: what is in the cgroup and, while the shell lives, whatever
    runs below it (a command that moved itself out of the cgroup: ``systemd-run
    --scope``, ``cgexec``).

    The shell started this process ``wrap.WATCH_AFTER_S`` after the command, outside its
    cgroup, and sends it SIGTERM once the command is over, then waits for its exit code:
    from the moment it kills, it ignores SIGTERM, so the shell's answer is 124 or 129.
    It ends by itself only when the shell is gone and the cgroup is empty."""
    deadline = started + _bounded(seconds)
    poller = select.poll()
    for fd in (1, 2):
        poller.register(fd, 0)  # only POLLERR/POLLHUP: the reader went away
    reason: int | None = None
    while reason is None and (os.getppid() == shell or populated(cgroup) is not False):
        left = deadline - now()
        if left <= 0:
            reason = TIMEOUT_EXIT
            break
        if poller.poll(min(left, WAKE_S) * 1000 + 1):
            reason = GONE_EXIT
    if reason is None:
        return 0
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the shell's "it is over" must not cut this short
    # The walk from the shell only while it is our parent: a pid of the dead may be reused.
    kill_tree(None, cgroup, shell if os.getppid() == shell else None)
    if reason == TIMEOUT_EXIT:
        sys.stderr.write(f"brctl: timeout: killed after {seconds:g}s, with all it started\n")
    return reason


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
