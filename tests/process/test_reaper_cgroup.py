"""The node-side reaper puts each command in a cgroup of its own where the machine allows one.

A cgroup v2 child of the reaper's own cgroup holds the command's whole tree from its first
instruction (the reaper moves itself in, spawns, moves back), so a timeout or Ctrl-C kills
all of it at once (``cgroup.kill``), whatever it did to its parentage; the directory is
removed afterwards. Where no cgroup can be made (no cgroup2, not root) the reaper falls
back to its subreaper and ``/proc`` walk, silently.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from brctl.diagnostics import reaper
from brctl.remote.wrap import wrapped
from tests.kits.procs import local_pids
from tests.kits.waiting import scaled, wait_for


def _usable_cgroup() -> str | None:
    """Our own cgroup v2 directory when a child can be made in it, else None."""
    return _may_make_child(reaper.own_cgroup())


def _may_make_child(where: str | None) -> str | None:
    """``where`` when a cgroup can be made in it (we are root there), else None."""
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


def _gone(pattern: str) -> bool:
    """True once no process matches ``pattern`` (an AssertionError if one stays)."""
    return wait_for(lambda: not local_pids(pattern), f"no process left matching {pattern!r}")


def _running(pattern: str) -> bool:
    """True once a process matches ``pattern`` (an AssertionError if none comes)."""
    return bool(wait_for(lambda: local_pids(pattern), f"a process matching {pattern!r}"))


def _emptied(cgroup: str) -> bool:
    """Whether nothing runs in ``cgroup`` any more (or it is removed)."""
    try:
        events = Path(cgroup, "cgroup.events")
        if events.exists():  # v2: what was killed in it may linger a moment
            return "populated 0" in events.read_text().splitlines()
        return not Path(cgroup, "cgroup.procs").read_text().split()
    except FileNotFoundError:
        return True


def _swept(cgroup: str, run: Callable[[list[str], float], object]) -> bool:
    """Whether ``cgroup`` is removed by the sweep just run, or else by the next one once
    what that sweep killed in it is gone."""
    if os.path.exists(cgroup):
        wait_for(lambda: _emptied(cgroup), f"what the sweep killed in {cgroup} to be gone")
        run(["true"], 10)
    return not os.path.exists(cgroup)


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
    assert re.search(r"/brctl-[0-9]+-[0-9a-f]{16}$", path), path
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
        # its business, as under plain ssh (a moment may pass before setsid is sleep)
        assert _running(r"^sleep 1161")
        path = _command_cgroup(done.stdout)
        assert not os.path.exists(os.path.join(reaper.cgroup_root() or "/nonexistent", path.lstrip("/")))
    finally:
        for pid in local_pids(r"^sleep 1161"):
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


# A setsid'd child that ignores SIGTERM and whose main thread exits (pthread_exit) while
# another thread runs on: /proc shows its leader as "Z", yet it is alive. The reaper once
# took it for a zombie in both its walk and the cgroup's pid list, found nothing left,
# never sent SIGKILL nor wrote cgroup.kill, reported a clean timeout and left it running
# (and its cgroup behind). The parent waits until the child's leader is "Z" before it
# says "ready", so the scenario is in place before the timeout.
_ZOMBIE_LEADER = """
import ctypes, os, signal, sys, threading, time
child = os.fork()
if child == 0:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stdout.write(f"escapee {os.getpid()}\\n" + open("/proc/self/cgroup").read())
    sys.stdout.flush()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    threading.Thread(target=time.sleep, args=(60,)).start()
    ctypes.CDLL(None).pthread_exit(None)
while open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
    time.sleep(0.01)
print("ready", flush=True)
time.sleep(60)
"""


def _runs(pid: int) -> bool:
    """Whether ``pid`` has a thread still running (a zombie leader with live threads does)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X") or len(os.listdir(f"/proc/{pid}/task")) > 1
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("way", ["cgroup", "walk"])
def test_a_timeout_kills_a_process_whose_main_thread_exited(way: str) -> None:
    prefix: tuple[str, ...] = ()
    if way == "cgroup":
        if _usable_cgroup() is None:
            pytest.skip("no writable cgroup v2 here: the reaper uses its /proc walk")
    elif os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv to run the reaper without a cgroup as root")
        prefix = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    elif _usable_cgroup() is not None:
        pytest.skip("a cgroup can be made here and no way to refuse it: no fallback to test")
    # "python3" as a node has it: the one on PATH that the reaper's user can run
    done = _run(["python3", "-c", _ZOMBIE_LEADER], scaled(1), prefix=prefix)
    (escapee,) = [int(ln.split()[1]) for ln in done.stdout.splitlines() if ln.startswith("escapee ")]
    try:
        assert "ready" in done.stdout.splitlines(), done.stdout
        assert done.returncode == reaper.TIMEOUT_EXIT, done.stderr
        assert done.stderr.startswith("brctl: timeout"), done.stderr
        wait_for(lambda: not _runs(escapee), f"the escapee {escapee} to be killed")
        if way == "cgroup":
            path = _command_cgroup(done.stdout)
            assert re.search(r"/brctl-[0-9]+-[0-9a-f]{16}$", path), path
            assert not os.path.exists(os.path.join(reaper.cgroup_root() or "/nonexistent", path.lstrip("/")))
    finally:
        if _runs(escapee):
            os.kill(escapee, 9)


def _imported(prefix: tuple[str, ...] = ()) -> set[str]:
    """The modules the reaper imports around a ``true`` (``-X importtime``'s lines)."""
    argv = wrapped(sys.executable, ["true"], 10)
    done = subprocess.run([*prefix, argv[0], "-X", "importtime", *argv[1:]], capture_output=True,
                          text=True, timeout=scaled(30))
    assert done.returncode == 0, done.stderr
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


# It runs before every command a node is given: each of these costs ~4-7 ms of node CPU
# a command (enum by way of `signal`, typing, contextlib's functools, ctypes).
_HEAVY = {"enum", "typing", "contextlib", "functools", "signal"}


def test_the_reaper_starts_lean_and_loads_ctypes_only_without_a_cgroup() -> None:
    if _usable_cgroup() is None:
        pytest.skip("no writable cgroup v2 here: the fallback's own test below covers the reaper")
    seen = _imported()
    assert "os" in seen or "select" in seen, seen  # -X importtime was read
    assert not seen & (_HEAVY | {"ctypes"}), sorted(seen)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_without_a_cgroup_the_reaper_loads_ctypes_for_the_subreaper_and_nothing_heavier() -> None:
    seen = _imported(("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"))
    assert "ctypes" in seen, sorted(seen)
    assert not seen & _HEAVY, sorted(seen)


def test_concurrent_reapers_each_keep_their_own_cgroup() -> None:
    """A reaper sweeps the empty cgroups SIGKILLed reapers left; it once also removed a
    concurrent reaper's cgroup in the instant between its mkdir and its move in, and that
    reaper fell back to the walk (1 of 48 here, more under a 64-wide fan-out)."""
    if _usable_cgroup() is None:
        pytest.skip("no writable cgroup v2 here: the reaper uses its /proc walk")
    for _ in range(3):
        procs = [subprocess.Popen(wrapped(sys.executable, ["cat", "/proc/self/cgroup"], 10),
                                  stdout=subprocess.PIPE, text=True) for _ in range(48)]
        outs = [p.communicate(timeout=scaled(60))[0] for p in procs]
        assert all(re.search(r"^0::.*/brctl-[0-9]+-[0-9a-f]{16}$", o, re.M) for o in outs), \
            [o for o in outs if "brctl-" not in o]


def test_a_stale_cgroup_an_older_reaper_left_is_swept_and_a_fresh_one_kept() -> None:
    """Names without a deadline (brctl before this one) keep the age rule: empty and old."""
    where = _usable_cgroup()
    if where is None:
        pytest.skip("no writable cgroup v2 here: the reaper uses its /proc walk")
    stale = os.path.join(where, reaper.CGROUP_PREFIX + "0" * 16)
    fresh = os.path.join(where, reaper.CGROUP_PREFIX + "1" * 16)
    os.mkdir(stale)
    os.mkdir(fresh)
    try:
        old = time.time() - reaper.SWEEP_AGE_S - 5
        os.utime(stale, (old, old))
        assert _run(["true"], 10).returncode == 0
        assert not os.path.exists(stale)  # left by a reaper killed with SIGKILL: removed
        assert os.path.isdir(fresh)  # may be a concurrent reaper's, not yet entered: kept
    finally:
        for path in (stale, fresh):
            if os.path.isdir(path):
                os.rmdir(path)


def _in_cgroup(path: str, argv: list[str]) -> subprocess.Popen[bytes]:
    """``argv`` started inside cgroup ``path``: it moves itself in before it execs, and
    Popen returns only after the exec, so it is in there when this returns."""
    def enter() -> None:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    return subprocess.Popen(argv, preexec_fn=enter, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _cgroup_of(pid: int) -> str:
    return os.path.join(reaper.cgroup_root() or "/nonexistent",
                        _command_cgroup(Path(f"/proc/{pid}/cgroup").read_text()).lstrip("/"))


def test_a_command_whose_reaper_was_killed_is_ended_by_a_later_reaper_once_overdue() -> None:
    """kill -9 of a reaper (OOM, ``pkill -9 python3``) left its command running past its
    deadline for ever. Its cgroup's name carries that deadline on the clock every process
    shares (CLOCK_BOOTTIME): the next reaper that sees it ``ORPHAN_S`` overdue ends it."""
    where = _usable_cgroup()
    if where is None:
        pytest.skip("no writable cgroup v2 here: the reaper uses its /proc walk")
    victim = subprocess.Popen(wrapped(sys.executable, ["sh", "-c", "setsid sleep 1181 & sleep 1182"], 600),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cgroup = overdue = ""
    try:
        assert _running(r"^sleep 1181") and _running(r"^sleep 1182")
        (sleeper,) = local_pids(r"^sleep 1182")
        cgroup = _cgroup_of(sleeper)
        due = int(os.path.basename(cgroup).split("-")[1])
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
        assert now + 590 < due <= now + 601  # the name says when the command must be over
        victim.kill()  # SIGKILL: no reaper is left to end the tree
        victim.wait()
        assert _run(["true"], 10).returncode == 0  # a later command: not yet due, kept
        assert local_pids(r"^sleep 1181") and local_pids(r"^sleep 1182") and os.path.isdir(cgroup)
        # time passes: the same orphans in a cgroup named overdue by more than ORPHAN_S
        # (cgroup v2 refuses renames, so they move house)
        overdue = os.path.join(where, f"{reaper.CGROUP_PREFIX}{int(now - reaper.ORPHAN_S - 5)}-{'e' * 16}")
        os.mkdir(overdue)
        for member in Path(cgroup, "cgroup.procs").read_text().split():
            with open(os.path.join(overdue, "cgroup.procs"), "w") as f:
                f.write(member)
        _rmdir(cgroup)
        assert _run(["true"], 10).returncode == 0
        assert _gone(r"^sleep 118[12]")  # the setsid escapee too: the cgroup held it
        assert _swept(overdue, _run)
    finally:
        for pid in local_pids(r"^sleep 118[12]"):
            os.kill(pid, 9)
        victim.kill()
        for path in (cgroup, overdue):
            if path and os.path.isdir(path):
                Path(path, "cgroup.kill").write_text("1")
                _rmdir(path)


def test_a_cgroup_not_yet_overdue_is_left_alone_whatever_it_holds() -> None:
    """A live reaper's cgroup (deadline ahead, or passed by less than ``ORPHAN_S``: it is
    still ending its tree) is never touched by another reaper's sweep."""
    where = _usable_cgroup()
    if where is None:
        pytest.skip("no writable cgroup v2 here: the reaper uses its /proc walk")
    now = int(time.clock_gettime(time.CLOCK_BOOTTIME))
    ahead = os.path.join(where, f"{reaper.CGROUP_PREFIX}{now + 300}-{'a' * 16}")
    ending = os.path.join(where, f"{reaper.CGROUP_PREFIX}{int(now - reaper.ORPHAN_S / 2)}-{'b' * 16}")
    procs = []
    try:
        for path, tag in ((ahead, "1191"), (ending, "1192")):
            os.mkdir(path)
            procs.append(_in_cgroup(path, ["sleep", tag]))
        assert _run(["true"], 10).returncode == 0
        assert all(p.poll() is None for p in procs)
        assert os.path.isdir(ahead) and os.path.isdir(ending)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for path in (ahead, ending):
            _rmdir(path)


def _rmdir(cgroup: str) -> None:
    """Remove ``cgroup`` once what left or was killed in it is gone (it lingers a moment)."""
    wait_for(lambda: _emptied(cgroup), f"what was in {cgroup} to be gone")
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(cgroup)


def test_on_a_systemd_machine_the_user_s_other_session_scopes_are_swept_too() -> None:
    """Each ssh connection is a logind session scope of its own there: the next command's
    reaper never shares a parent with a dead one's, so it looks in the sessions beside its
    own (and nowhere else: a service beside them is not brctl's to sweep)."""
    where = _usable_cgroup()
    if where is None:
        pytest.skip("no writable cgroup v2 here: the reaper uses its /proc walk")
    user = os.path.join(where, f"brctl-test-user-{os.getpid()}.slice")
    mine, dead_one, service = (os.path.join(user, n) for n in ("session-7.scope", "session-3.scope", "x.service"))
    overdue = f"{reaper.CGROUP_PREFIX}{int(time.clock_gettime(time.CLOCK_BOOTTIME) - reaper.ORPHAN_S - 5)}-{'c' * 16}"
    procs = []
    try:
        for path in (user, mine, dead_one, service, os.path.join(dead_one, overdue), os.path.join(service, overdue)):
            os.mkdir(path)
        orphan = _in_cgroup(os.path.join(dead_one, overdue), ["sleep", "1201"])
        kept = _in_cgroup(os.path.join(service, overdue), ["sleep", "1202"])
        procs = [orphan, kept]

        def in_session() -> None:  # this reaper is the next command of the same user
            with open(os.path.join(mine, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

        done = subprocess.run(wrapped(sys.executable, ["true"], 10), preexec_fn=in_session,
                              capture_output=True, text=True, timeout=scaled(30))
        assert done.returncode == 0, done.stderr
        assert orphan.wait(timeout=scaled(5)) == -9
        assert kept.poll() is None and os.path.isdir(os.path.join(service, overdue))
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for path in (os.path.join(dead_one, overdue), os.path.join(service, overdue), mine, dead_one, service, user):
            if os.path.isdir(path):
                _rmdir(path)


@pytest.mark.parametrize("seconds", [3_000_000.0, 1e300, float("inf")])
def test_a_timeout_of_months_or_no_number_still_supervises(seconds: float) -> None:
    """poll() takes at most ~24 days: a longer timeout crashed the reaper after the spawn
    and its command ran on unsupervised, moved out of its cgroup."""
    done = _run(["sh", "-c", "echo ran"], seconds)
    assert (done.returncode, done.stdout.splitlines()[-1:], done.stderr) == (0, ["ran"], "")


def test_a_timeout_under_a_millisecond_is_not_zero() -> None:
    assert wrapped("python3", ["true"], 0.0004)[5] == "0.0004"


def test_only_a_reaper_s_name_is_read_as_a_deadline() -> None:
    tag = "0123456789abcdef"
    assert reaper._due(f"brctl-1234-{tag}") == 1234
    assert reaper._due(f"brctl-{tag}") == 0  # an older reaper's: the age rule
    for name in (f"brctl-²-{tag}", f"brctl-٣-{tag}", f"brctl-12-{tag[:-1]}", f"brctl-1-{tag.upper()}",
                 "brctl-test-user-1.slice", f"other-1-{tag}", f"brctl-1x-{tag}"):
        assert reaper._due(name) is None, name  # '²'.isdigit() and int() refused it: every reaper crashed


# -- a machine with cgroup v1 only (RHEL 8's default): v1's freezer hierarchy, at its root --

# The reaper as a v1-only machine runs it: this machine has cgroup v2 too, so the test
# hides it (in the test's own interpreter, never by a switch in the reaper).
_AS_V1 = ("import sys; from brctl.diagnostics import reaper; reaper.cgroup_root = lambda: None;"
          "sys.exit(reaper.main(sys.argv[1:]))")
ROOT = Path(__file__).resolve().parents[2]


def _freezer() -> str | None:
    """The v1 freezer root when this process is at it and may make a cgroup there."""
    where = reaper._mount("cgroup", "freezer")
    if where is None or _freezer_path(Path("/proc/self/cgroup").read_text()) != "/":
        return None
    return _may_make_child(where)


def _run_v1(argv: list[str], timeout: float, enter: str | None = None) -> subprocess.CompletedProcess[str]:
    def move() -> None:
        if enter is not None:
            Path(enter, "cgroup.procs").write_text(str(os.getpid()))
    return subprocess.run([sys.executable, "-c", _AS_V1, repr(float(timeout)), *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=scaled(30), preexec_fn=move)


def _freezer_path(stdout: str) -> str:
    (line,) = [ln for ln in stdout.splitlines() if ln.split(":")[1:2] == ["freezer"]]
    return line.split(":", 2)[2]


def test_without_cgroup_v2_a_command_runs_in_a_freezer_cgroup_of_its_own() -> None:
    """cgroup v1 only: the same cgroup-held tree, named with its deadline, at the root of
    the freezer hierarchy (systemd leaves it alone); a timeout ends a setsid escapee too
    (v1 has no cgroup.kill: each member is killed) and the cgroup is removed."""
    root = _freezer()
    if root is None:
        pytest.skip("no writable cgroup v1 freezer hierarchy at its root here")
    done = _run_v1(["cat", "/proc/self/cgroup"], 10)
    assert done.returncode == 0, done.stderr
    path = _freezer_path(done.stdout)
    assert re.fullmatch(r"/brctl-[0-9]+-[0-9a-f]{16}", path), path
    assert not os.path.exists(root + path)
    script = "cat /proc/self/cgroup; (setsid sh -c 'sleep 1211 & exit' &); sleep 1212"
    done = _run_v1(["sh", "-c", script], scaled(1))
    assert done.returncode == reaper.TIMEOUT_EXIT, done.stderr
    assert _gone(r"^sleep 121[12]")
    assert not os.path.exists(root + _freezer_path(done.stdout))


def test_inside_someone_else_s_freezer_cgroup_no_cgroup_is_made() -> None:
    """A freezer cgroup below the root is someone's tracking (a Slurm step, a container):
    a command moved below it would hide from a kill of it. The walk ends the tree."""
    root = _freezer()
    if root is None:
        pytest.skip("no writable cgroup v1 freezer hierarchy at its root here")
    step = os.path.join(root, f"brctl-test-step-{os.getpid()}")
    os.mkdir(step)
    try:
        script = "cat /proc/self/cgroup; (setsid sh -c 'sleep 1221 & exit' &); sleep 1222"
        done = _run_v1(["sh", "-c", script], scaled(1), enter=step)
        assert done.returncode == reaper.TIMEOUT_EXIT, done.stderr
        assert _freezer_path(done.stdout) == step[len(root):]
        assert _gone(r"^sleep 122[12]")
        assert not [n for n in os.listdir(step) if n.startswith(reaper.CGROUP_PREFIX)]
    finally:
        _rmdir(step)


def test_without_cgroup_v2_an_overdue_freezer_cgroup_is_swept() -> None:
    """A dead reaper's cgroup, ``ORPHAN_S`` past its deadline, at the freezer root: the
    next reaper ends what it holds and removes it."""
    root = _freezer()
    if root is None:
        pytest.skip("no writable cgroup v1 freezer hierarchy at its root here")
    now = time.clock_gettime(time.CLOCK_BOOTTIME)
    overdue = os.path.join(root, f"{reaper.CGROUP_PREFIX}{int(now - reaper.ORPHAN_S - 5)}-{'d' * 16}")
    ahead = os.path.join(root, f"{reaper.CGROUP_PREFIX}{int(now + 300)}-{'f' * 16}")
    os.mkdir(overdue)
    os.mkdir(ahead)
    orphan, kept = _in_cgroup(overdue, ["sleep", "1231"]), _in_cgroup(ahead, ["sleep", "1232"])
    try:
        assert _run_v1(["true"], 10).returncode == 0
        assert orphan.wait(timeout=scaled(5)) == -9
        assert _swept(overdue, _run_v1)
        assert kept.poll() is None and os.path.isdir(ahead)
    finally:
        for p in (orphan, kept):
            p.kill()
            p.wait()
        for path in (overdue, ahead):
            if os.path.isdir(path):
                _rmdir(path)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_freezer_mounted_where_the_path_has_a_space_still_holds_the_command(tmp_path: Path) -> None:
    """mountinfo writes a space in a mount point as ``\\040`` (a tab, newline or backslash
    likewise): the reaper must read the path it stands for, not look for a directory
    named with the escape, find none and leave the command to the walk."""
    mounted = _freezer()
    if mounted is None:
        pytest.skip("no writable cgroup v1 freezer hierarchy at its root here")
    where = tmp_path / "free zer\tx"
    where.mkdir()
    inner = (f"umount {shlex.quote(mounted)} && mount -t cgroup -o freezer cgroup {shlex.quote(str(where))}"
             f" && exec {shlex.quote(sys.executable)} -c {shlex.quote(_AS_V1)} 10 cat /proc/self/cgroup")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner], cwd=ROOT,
                          capture_output=True, text=True, timeout=scaled(30))
    if "mount" in done.stderr and done.returncode != 0:
        pytest.skip(f"cannot mount the freezer hierarchy here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"/brctl-[0-9]+-[0-9a-f]{16}", _freezer_path(done.stdout)), done.stdout


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_mount_point_named_in_bytes_that_are_not_utf_8_does_not_stop_every_command(tmp_path: Path) -> None:
    """Any user may mount there (FUSE's fusermount) at a path of its choosing, and
    mountinfo writes its bytes as they are: reading it as strict UTF-8 crashed every
    reaper before its command ran (exit 1, a traceback), cgroup v2 or v1."""
    where = os.path.join(os.fsencode(tmp_path), b"job\xff\xfemount")
    os.mkdir(where)
    mount = f"mount -t tmpfs brctl-test {shlex.quote(os.fsdecode(where))}"
    prefix = ("unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mount} && exec "$@"', "sh")
    done = _run(["echo", "ran"], 10, prefix)
    assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr
    if _freezer() is not None:
        done = subprocess.run([*prefix, sys.executable, "-c", _AS_V1, "10", "cat", "/proc/self/cgroup"], cwd=ROOT,
                              capture_output=True, text=True, timeout=scaled(30))
        assert done.returncode == 0, done.stderr
        assert re.fullmatch(r"/brctl-[0-9]+-[0-9a-f]{16}", _freezer_path(done.stdout)), done.stdout
