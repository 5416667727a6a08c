"""The shell start (``brctl.remote.wrap.START``): a command run as a node's login shell
runs it, supervised without an interpreter until it has run ``WATCH_AFTER_S``.

Run here as sshd runs it (``bash -c LINE`` in a session of its own), under dash and
under bash as ``sh`` (RHEL's ``/bin/sh``), as root with a writable cgroup v2."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from brctl.diagnostics import reaper
from brctl.remote.wrap import START, WATCH_AFTER_S, shell_line, wrapped
from tests.kits.procs import local_pids
from tests.kits.waiting import PATIENCE, deadline, scaled, wait_for
from tests.process.test_reaper_cgroup import _rmdir, _swept, _usable_cgroup

ENV = {**os.environ, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}  # the system python3, as over ssh


def _cgroup_dir() -> str | None:
    """Our cgroup v2 directory where a child can be made in it (not v1's freezer: the
    start uses v2 only), else None."""
    return _usable_cgroup() if reaper.cgroup_root() is not None else None


pytestmark = pytest.mark.skipif(_cgroup_dir() is None or not os.path.exists("/usr/bin/python3"),
                                reason="needs a writable cgroup v2 and /usr/bin/python3")


@pytest.fixture(params=["dash", "bash"])
def shell(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "dash":
        yield "/bin/sh"
        return
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    where = Path(tempfile.mkdtemp(prefix="brctl-bash-sh-"))  # not pytest's 0700 tree: nobody runs it too
    where.chmod(0o755)
    wrapper = where / "sh"
    wrapper.write_text(f"#!/bin/sh\nexec {shutil.which('bash')} --posix \"$@\"\n")
    wrapper.chmod(0o755)
    yield str(wrapper)
    shutil.rmtree(where)


def _line(argv: list[str], timeout: float, shell: str) -> list[str]:
    return ["bash", "-c", shell_line("python3", argv, timeout, shell=shell)]


def _run(argv: list[str], timeout: float, shell: str, data: bytes = b"",
         prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, *_line(argv, timeout, shell)], input=data.decode(), env=ENV,
                          capture_output=True, text=True, timeout=scaled(30), start_new_session=True)


def _gone(pattern: str) -> bool:
    """True once no process matches ``pattern`` (an AssertionError if one stays)."""
    return wait_for(lambda: not local_pids(pattern), f"no process left matching {pattern!r}")


def _cgroup(stdout: str) -> str:
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith("0::")]
    return os.path.join(reaper.cgroup_root() or "/nonexistent", line[3:].lstrip("/"))


def test_the_start_has_no_backslash_for_fish_to_read() -> None:
    assert "\\" not in START


def test_a_command_gets_its_stdin_output_and_exit_code_in_a_cgroup_removed_after(shell: str) -> None:
    done = _run(["sh", "-c", "cat /proc/self/cgroup; cat; echo err >&2; exit 3"], 10, shell, b"data")
    assert (done.returncode, done.stderr) == (3, "err\n"), done
    assert done.stdout.endswith("data")
    path = _cgroup(done.stdout)
    assert re.search(r"/brctl-[0-9]+-[0-9a-f]{16}$", path) and reaper._due(os.path.basename(path)), path
    assert not os.path.exists(path)


def test_a_timeout_kills_the_whole_tree_whatever_it_does_with_sigterm(shell: str) -> None:
    script = ("cat /proc/self/cgroup; trap '' TERM; setsid sh -c \"trap '' TERM; exec sleep 1201\" & "
              "sh -c 'trap \"\" TERM; sleep 1202'; wait")
    # ~1.5 s and the 2 s grace expected; what it would wait out: sleeps of 20 minutes
    with deadline(20 + reaper.GRACE_S, "a 1.5 s timeout of a tree that ignores SIGTERM"):
        done = _run(["sh", "-c", script], scaled(1.5), shell)
    assert done.returncode == reaper.TIMEOUT_EXIT, done
    assert done.stderr == f"brctl: timeout: killed after {scaled(1.5):g}s, with all it started\n"
    assert _gone(r"^sleep 120[12]")
    assert not os.path.exists(_cgroup(done.stdout))


def test_a_timeout_shorter_than_the_watch_s_delay_still_kills(shell: str) -> None:
    done = _run(["sh", "-c", "setsid sleep 1203 & sleep 1204"], 0.3, shell)
    assert done.returncode == reaper.TIMEOUT_EXIT, done
    assert _gone(r"^sleep 120[34]")


def test_a_lost_reader_kills_the_tree(shell: str) -> None:
    proc = subprocess.Popen(_line(["sh", "-c", "setsid sleep 1211 & sleep 1212"], 600, shell), env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for(lambda: len(local_pids(r"^sleep 121[12]")) == 2, "the command's two sleeps")
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # Ctrl-C on the controller, a lost connection: the channel is gone
        proc.stderr.close()
        assert proc.wait(scaled(5)) == reaper.GONE_EXIT
        assert _gone(r"^sleep 121[12]")
    finally:
        proc.kill()
        for pid in local_pids(r"^sleep 121[12]"):
            os.kill(pid, 9)


def test_what_a_command_sends_its_process_group_reaches_neither_the_shell_nor_the_watch(shell: str) -> None:
    # The command runs in a session of its own, as the reaper spawned it: its own group is
    # all a ``kill 0`` reaches (a PIPE sent there ended the shell and the watch before).
    done = _run(["sh", "-c", "trap '' TERM HUP INT USR1 PIPE; for s in TERM HUP INT USR1 PIPE; do "
                 "kill -s $s 0; done; sleep 0.2; exit 4"], 10, shell)
    assert done.returncode == 4, done
    done = _run(["sh", "-c", "trap '' PIPE TERM; kill -s PIPE 0; sleep 1.3; kill -s PIPE 0; sleep 1221"],
                scaled(2), shell)
    assert done.returncode == reaper.TIMEOUT_EXIT, done
    assert _gone(r"^sleep 1221")
    done = _run(["sh", "-c", "sleep 1222 & kill -TERM -$$; sleep 5"], 10, shell)  # the cleanup idiom
    assert done.returncode == 143, done
    assert _gone(r"^sleep 1222")


def test_a_command_that_leaves_its_cgroup_is_still_killed_at_its_deadline(shell: str) -> None:
    where = _cgroup_dir()
    assert where is not None
    other = os.path.join(where, f"brctl-test-other-{os.getpid()}")
    os.mkdir(other)
    try:  # as systemd-run --scope or cgexec would move it
        done = _run(["sh", "-c", f"echo $$ > {other}/cgroup.procs; sleep 1223"], scaled(2), shell)
        assert done.returncode == reaper.TIMEOUT_EXIT, done
        assert _gone(r"^sleep 1223")
    finally:
        for pid in local_pids(r"^sleep 1223"):
            os.kill(pid, 9)
        _rmdir(other)


def test_options_the_login_environment_turns_on_change_nothing(shell: str) -> None:
    env = {**ENV, "SHELLOPTS": "errexit:noclobber:noglob:nounset"}  # xtrace: the login shell would trace too
    done = subprocess.run(_line(["sh", "-c", "cat /proc/self/cgroup; exit 1"], 10, shell), env=env,
                          capture_output=True, text=True, timeout=scaled(30), start_new_session=True)
    assert (done.returncode, done.stderr) == (1, ""), done
    assert not os.path.exists(_cgroup(done.stdout))


@pytest.mark.parametrize("timeout", [-1e300, float("-inf"), 0.0])
def test_a_timeout_already_past_kills_at_once(shell: str, timeout: float) -> None:
    done = _run(["sleep", "1224"], timeout, shell)
    assert done.returncode == reaper.TIMEOUT_EXIT, done
    assert _gone(r"^sleep 1224")


def test_an_argv_that_starts_with_a_dash_is_a_command_not_an_option(shell: str) -> None:
    done = _run(["-a", "x", "true"], 10, shell)
    assert done.returncode == 127, done


def _ended(pid: int) -> bool:
    """Whether ``pid`` is gone, exiting, a zombie, or has SIGTERM or SIGKILL pending: what
    a kill sent before the caller looked makes of a process not yet scheduled to die."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
    except (OSError, IndexError):
        return True
    fatal = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGKILL - 1))
    pending = [int(line.split()[1], 16) for line in status.splitlines()
               if line.startswith(("SigPnd:", "ShdPnd:"))]
    return stat[0] in ("Z", "X") or bool(int(stat[6]) & PF_EXITING) or any(p & fatal for p in pending)


PF_EXITING = 0x4  # /proc/PID/stat's flags: the process is in exit()


def test_a_short_command_leaves_no_process_behind(shell: str) -> None:
    """The watch's ``sleep`` is killed before the shell exits (not left to end on its own
    a second later): when the shell is over, every such sleep of its session is ending."""
    proc = subprocess.Popen(_line(["sh", "-c", "echo $$"], 10, shell), env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = proc.communicate(timeout=scaled(30))
    assert proc.returncode == 0, (out, err)
    left = [pid for pid in local_pids(rf"^sleep {WATCH_AFTER_S:g} $") if _session(pid) == proc.pid]
    assert all(_ended(pid) for pid in left), f"the watch's sleep outlived the command: {left}"


def _session(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def test_the_command_gets_every_signal_s_default_disposition(shell: str) -> None:
    code = ("import signal as s; print(' '.join(str(s.getsignal(getattr(s, 'SIG' + n))) for n in "
            "'INT QUIT TERM HUP USR1 USR2 ALRM'.split()))")
    done = _run(["/usr/bin/python3", "-c", code], 10, shell)
    assert done.returncode == 0, done
    # Python's own SIGINT handler is what it installs over SIG_DFL (over SIG_IGN, none)
    assert done.stdout.startswith("<built-in function default_int_handler>"), done.stdout
    assert "SIG_IGN" not in done.stdout, done.stdout


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_where_no_cgroup_can_be_made_the_reaper_runs_the_command_itself(shell: str) -> None:
    nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    done = _run(["sh", "-c", "cat /proc/self/cgroup; setsid sleep 1231 & sleep 1232"], scaled(1), shell,
                prefix=nobody)
    assert done.returncode == reaper.TIMEOUT_EXIT, done
    assert "brctl-" not in done.stdout
    assert _gone(r"^sleep 123[12]")


def test_an_overdue_cgroup_a_killed_supervisor_left_is_swept_by_the_next_start(shell: str) -> None:
    where = _cgroup_dir()
    assert where is not None
    now = time.clock_gettime(time.CLOCK_BOOTTIME)
    # this test process's own name: xdist runs the shells' variants side by side
    overdue = os.path.join(where, f"{reaper.CGROUP_PREFIX}{int(now - reaper.ORPHAN_S - 5)}-"
                                  f"{os.getpid():016x}")
    os.mkdir(overdue)
    orphan = subprocess.Popen(["sh", "-c", f"echo 0 > {overdue}/cgroup.procs; exec setsid sleep 1241"],
                              start_new_session=True)
    try:
        # The shell moves itself in, then setsid (a group leader's) forks the sleep there and
        # exits: once it has, the sleep is in the cgroup, or was already swept by another
        # start on this host (waiting to see it running lost that race under load); such a
        # sweep may kill the shell itself before it exits (SIGKILL: the cgroup's kill).
        assert orphan.wait(timeout=scaled(PATIENCE)) in (0, -signal.SIGKILL)
        assert _run(["true"], 10, shell).returncode == 0  # the sweep kills it
        assert _gone(r"^sleep 1241")
        assert _swept(overdue, lambda argv, timeout: _run(argv, timeout, shell))
    finally:
        orphan.kill()
        orphan.wait()
        if os.path.isdir(overdue):
            Path(overdue, "cgroup.kill").write_text("1")
            _rmdir(overdue)


@pytest.mark.parametrize("login", ["bash", "zsh", "fish"])
def test_every_login_shell_runs_the_line(login: str) -> None:
    """sshd hands the line to the user's login shell: whatever it is, the command runs
    supervised (the reaper's source with a backslash pair failed every command on fish)."""
    if shutil.which(login) is None:
        pytest.skip(f"{login} not installed")
    for argv, timeout, code in ((["sh", "-c", "echo ran; exit 3"], 10.0, 3), (["sleep", "1251"], 0.5, 124)):
        for line in (shell_line("python3", argv, timeout), shlex.join(wrapped("python3", argv, timeout))):
            done = subprocess.run([login, "-c", line], env=ENV, capture_output=True, text=True,
                                  timeout=scaled(30), start_new_session=True)
            assert done.returncode == code, (login, done)
    assert _gone(r"^sleep 1251")
