"""The transport under dying machines, runaway commands, Ctrl-C and huge output (issue 14).

Every test proves what happened on the node (its processes) and on the controller
(state, seconds, CPU, memory), over real sshd.
"""

from __future__ import annotations

import dataclasses
import io
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from brctl.core.transport import Node, NodeState, RunResult
from brctl.remote.local import LocalTransport
from brctl.remote.ssh.liveness import cannot_send
from brctl.remote.ssh.paramiko_lite import paramiko
from brctl.remote.ssh.transport import SshTransport
from brctl.remote.wrap import GRACE_S, SLACK_S
from tests.integration.test_ssh_transport import MakeCluster, nodes_of
from tests.kits.cluster import SshCluster, scaled
from tests.kits.procs import local_pids

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _wait_for(predicate: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return bool(predicate())  # type: ignore[operator]


def _in_thread(
    transport: SshTransport, node: Node, argv: list[str], timeout: float, stdin: bytes | None = None,
    *, call: str = "run", name: str | None = None,
) -> dict[str, object]:
    """``transport.run`` (or ``call``) in a thread named ``name`` (``_freezing_at`` freezes
    the "probe" thread's command); the dict gets the result, when it came and the thread's
    CPU seconds."""
    box: dict[str, object] = {}

    def go() -> None:
        cpu = time.thread_time()
        box["result"] = getattr(transport, call)(node, argv, timeout=timeout, stdin=stdin)
        box["at"] = time.monotonic()
        box["cpu"] = time.thread_time() - cpu

    box["thread"] = threading.Thread(target=go, daemon=True, name=name)
    box["thread"].start()  # type: ignore[attr-defined]
    return box


def _timed_out(box: dict[str, object], t0: float, bound: float, wait: float) -> RunResult:
    """The result of ``_in_thread``'s command, waited for up to ``wait`` s: a ``timeout``
    that came within ``bound`` s of ``t0``."""
    box["thread"].join(wait)  # type: ignore[attr-defined]
    r = box.get("result")
    assert isinstance(r, RunResult) and r.state is NodeState.TIMEOUT, (time.monotonic() - t0, box)
    assert float(box["at"]) - t0 <= bound, (float(box["at"]) - t0, r)  # type: ignore[arg-type]
    return r


def test_sshd_killed_mid_command_is_unreachable_at_once_without_spinning(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(1)
    node = nodes_of(cluster)[0]
    transport = SshTransport(ssh_config=os.devnull)
    try:
        box = _in_thread(transport, node, ["sleep", "10"], timeout=scaled(10))
        assert _wait_for(lambda: cluster.node_pids("node01", r"^sleep 10"), scaled(10))
        time.sleep(1)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cluster.stop_node("node01")
        stopped = time.monotonic()
        box["thread"].join(scaled(12))  # type: ignore[attr-defined]
        r = box["result"]
        assert isinstance(r, RunResult)
        assert r.state is NodeState.UNREACHABLE, r
        assert "connection lost while running" in r.stderr
        assert float(box["at"]) - stopped <= scaled(1.0)  # type: ignore[arg-type]
        assert float(box["cpu"]) <= scaled(0.5)  # type: ignore[arg-type]  # it spun 12 s before
        after = resource.getrusage(resource.RUSAGE_SELF)
        spent = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
        assert spent <= scaled(1.0), spent
    finally:
        transport.close()


def test_timeout_kills_a_sigterm_ignoring_command_and_its_setsid_child(
    ssh_cluster: SshCluster,
) -> None:
    node = nodes_of(ssh_cluster, ["node02"])[0]
    script = ("trap '' TERM; setsid sh -c \"trap '' TERM; exec sleep 1011\" & "
              "sh -c 'trap \"\" TERM; sleep 1012'; wait")
    transport = SshTransport(ssh_config=os.devnull)
    try:
        r = transport.run(node, ["sh", "-c", script], timeout=scaled(1))
    finally:
        transport.close()
    assert r.state is NodeState.TIMEOUT, r
    assert "killed after" in r.stderr
    assert r.seconds <= scaled(1) + 2 + scaled(3)  # timeout, the SIGKILL grace, slack
    assert ssh_cluster.node_pids("node02", r"sleep 101[12]") == []


def test_a_closed_channel_kills_the_remote_tree(ssh_cluster: SshCluster) -> None:
    """``cancel`` (the first Ctrl-C) closes the channel; the node kills everything."""
    node = nodes_of(ssh_cluster, ["node03"])[0]
    transport = SshTransport(ssh_config=os.devnull)
    try:
        box = _in_thread(transport, node, ["sh", "-c", "setsid sleep 1021 & sleep 1022"],
                         timeout=scaled(60))
        assert _wait_for(lambda: len(ssh_cluster.node_pids("node03", r"^sleep 102[12]")) == 2,
                         scaled(10))
        t0 = time.monotonic()
        transport.cancel()
        box["thread"].join(scaled(3))  # type: ignore[attr-defined]
        r = box["result"]
        assert isinstance(r, RunResult) and r.state is NodeState.TIMEOUT, r
        assert "interrupted" in r.stderr
        assert time.monotonic() - t0 <= scaled(3)
        assert _wait_for(lambda: not ssh_cluster.node_pids("node03", r"sleep 102[12]"), scaled(5))
        assert transport.run(node, ["true"], timeout=5).state is NodeState.TIMEOUT  # no new work
    finally:
        transport.close()


def _unsent(address: str, port: int) -> int:
    """Bytes this host's TCP sockets to ``address:port`` hold unacknowledged (/proc/net/tcp)."""
    peer = f"{int.from_bytes(socket.inet_aton(address), sys.byteorder):08X}:{port:04X}"
    total = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[2] == peer:
            total += int(fields[4].split(":")[0], 16)
    return total


# Channels fed at once to fill a frozen node's socket. A channel may send only its SSH
# window (OpenSSH: 2 MiB, at least ~1 MiB open between adjustments), and a frozen node's
# kernel still takes up to its receive buffer (6 MiB here): with 8 the socket was once
# seen to drain empty instead of filling.
FEEDERS = 16


def _frozen_mid_stdin(cluster: SshCluster, transport: SshTransport, node: Node,
                      timeout: float) -> list[dict[str, object]]:
    """``node`` frozen while FEEDERS commands were being sent a big stdin, its socket full: a
    channel close there blocks. The commands' boxes (``_in_thread``)."""
    feeding = _feeding(cluster, transport, node, timeout)
    _freeze_full(cluster, node)
    return feeding


def _feeding(cluster: SshCluster, transport: SshTransport, node: Node,
             timeout: float, size: int = 256 << 20) -> list[dict[str, object]]:
    """FEEDERS commands on ``node`` being sent ``size`` bytes of stdin each, running (``_in_thread`` boxes)."""
    data = bytes(size)  # far more than the sockets hold; zero pages, no real memory
    feeding = [_in_thread(transport, node, ["sh", "-c", "cat >/dev/null"], timeout, stdin=data)
               for _ in range(FEEDERS)]
    assert _wait_for(lambda: len(cluster.node_pids(node.name, r"^cat\b")) == FEEDERS, scaled(20))
    return feeding


def _ended(feeding: list[dict[str, object]]) -> None:
    """Commands whose connection was closed or thawed (``_feeding``) end, raising nothing
    (soon: not a bound of brctl's, which the callers assert on their own command)."""
    deadline = time.monotonic() + scaled(15)
    for run in feeding:
        run["thread"].join(max(0.0, deadline - time.monotonic()))  # type: ignore[attr-defined]
        assert isinstance(run.get("result"), RunResult), run


def _freeze_full(cluster: SshCluster, node: Node) -> None:
    """Freeze ``node`` while it is being fed (``_feeding``); return once its socket is full."""

    def stuck() -> bool:  # the frozen node's receive window is full and nothing moves
        before = _unsent(node.address, cluster.port)
        time.sleep(0.5)
        return before > 0 and _unsent(node.address, cluster.port) == before

    for _ in range(8):
        cluster.freeze_node(node.name)
        if _wait_for(stuck, scaled(2)):
            return
        # Frozen with the channels' windows nearly spent, or mid key exchange (paramiko
        # rekeys every 512 MiB): too little is sent to fill the socket. Thaw, freeze again.
        cluster.thaw_node(node.name)
        time.sleep(0.3)
    raise AssertionError(f"{node.name}'s socket did not fill")


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_command_on_a_frozen_node_whose_socket_is_full_times_out_and_returns(
    make_cluster: MakeCluster,
) -> None:
    """Closing its channel would block (the socket is full): each command still returns
    ``timeout`` when the controller gives up, raises nothing and holds no fan-out slot."""
    cluster = make_cluster(1)
    (frozen,) = nodes_of(cluster)
    transport = SshTransport(ssh_config=os.devnull)
    timeout = scaled(6)  # the freeze (retries included) happens within it
    try:
        t0 = time.monotonic()
        feeding = _frozen_mid_stdin(cluster, transport, frozen, timeout)
        give_up = timeout + GRACE_S + SLACK_S
        for run in feeding:
            run["thread"].join(max(0.0, t0 + give_up + scaled(2) - time.monotonic()))  # type: ignore[attr-defined]
            r = run.get("result")
            assert isinstance(r, RunResult) and r.state is NodeState.TIMEOUT, run
            assert float(run["at"]) - t0 <= give_up + scaled(2)  # type: ignore[arg-type]
        assert _unsent(frozen.address, cluster.port) > 0  # still stuck: the closes wait behind
    finally:
        cluster.thaw_node(frozen.name)
        transport.close()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_frozen_node_whose_connection_cannot_send_holds_up_no_other_node_s_cancel(
    make_cluster: MakeCluster,
) -> None:
    """Ctrl-C while a frozen node was being sent stdin: closing its channels blocks (the
    socket is full), yet every other node's command is killed at once."""
    cluster = make_cluster(3)
    frozen, *healthy = nodes_of(cluster)
    transport = SshTransport(ssh_config=os.devnull)
    sleeping = [_in_thread(transport, node, ["sleep", "1141"], scaled(60))
                for node in healthy for _ in range(2)]
    try:
        assert _wait_for(lambda: all(len(cluster.node_pids(n.name, r"^sleep 1141")) == 2 for n in healthy),
                         scaled(20))
        feeding = _frozen_mid_stdin(cluster, transport, frozen, scaled(60))
        box: dict[str, object] = {}

        def ctrl_c() -> None:
            try:
                transport.cancel()
            except Exception as exc:
                box["error"] = exc
            box["at"] = time.monotonic()

        t0 = time.monotonic()
        threading.Thread(target=ctrl_c, daemon=True).start()
        gone = lambda: not any(cluster.node_pids(n.name, r"^sleep 1141") for n in healthy)  # noqa: E731
        assert _wait_for(gone, scaled(2)), "a frozen node's channel close held up the others"
        assert _wait_for(lambda: "at" in box, scaled(1)), "cancel() blocked"
        assert "error" not in box, box
        assert float(box["at"]) - t0 <= scaled(1)  # type: ignore[arg-type]
        for run in sleeping:
            run["thread"].join(scaled(3))  # type: ignore[attr-defined]
            r = run["result"]
            assert isinstance(r, RunResult) and r.state is NodeState.TIMEOUT, r
            assert "interrupted" in r.stderr
        # The frozen node is still stuck: its closes wait in line behind the stdin ...
        assert _unsent(frozen.address, cluster.port) > 0
        assert len(cluster.node_pids(frozen.name, r"^cat\b")) == FEEDERS
        # ... and go out once it thaws: its commands are killed too.
        cluster.thaw_node(frozen.name)
        assert _wait_for(lambda: not cluster.node_pids(frozen.name, r"^cat\b"), scaled(10))
        _ended(feeding)
    finally:
        cluster.thaw_node(frozen.name)
        transport.close()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_session_asked_of_a_frozen_node_whose_socket_is_full_is_a_timeout_within_connect_timeout(
    make_cluster: MakeCluster,
) -> None:
    """The session request cannot even be sent (the cached connection's socket is full):
    it is still a ``timeout`` within ``connect_timeout``, as on a frozen node whose socket
    is not full, rather than the wait for the kernel to drop the connection and a new one."""
    cluster = make_cluster(1)
    (frozen,) = nodes_of(cluster, connect_timeout=scaled(4))
    transport = SshTransport(ssh_config=os.devnull)
    try:
        feeding = _frozen_mid_stdin(cluster, transport, frozen, scaled(60))
        box = _in_thread(transport, frozen, ["true"], scaled(3))
        t0 = time.monotonic()
        r = _timed_out(box, t0, frozen.connect_timeout + scaled(2), frozen.connect_timeout + scaled(3))
        assert "session request" in r.stderr, r
        # Its connection, stuck, was closed: the other commands on it end too, and none raised.
        _ended(feeding)
    finally:
        cluster.thaw_node(frozen.name)
        transport.close()


def _freezing_at(monkeypatch: pytest.MonkeyPatch, cluster: SshCluster, node: Node, method: str,
                 when: Callable[[paramiko.Channel], bool] = lambda chan: True) -> None:
    """Make ``paramiko.Channel.<method>``, called from a thread named "probe", first (once,
    after ``when(chan)`` holds) freeze ``node`` (being fed: ``_feeding``) and wait for its
    socket to fill: a send it then makes blocks, as when the node froze just before it."""
    original = getattr(paramiko.Channel, method)
    frozen: list[bool] = []

    def freezing(chan: paramiko.Channel, *args: object) -> object:
        if threading.current_thread().name == "probe" and not frozen:
            assert _wait_for(lambda: when(chan), scaled(10))
            frozen.append(True)
            _freeze_full(cluster, node)
        return original(chan, *args)

    monkeypatch.setattr(paramiko.Channel, method, freezing)


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("method", ["exec_command", "shutdown_write"])
@pytest.mark.parametrize("call", ["run", "stream"])
def test_a_command_whose_exec_request_or_eof_cannot_be_sent_times_out_at_its_give_up(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch, method: str, call: str,
) -> None:
    """The node froze, its socket full (other commands' stdin), just before the command's
    exec request or its stdin EOF (no stdin) went out: that send blocks until the kernel
    drops the connection. The command is still a ``timeout`` at its give-up."""
    cluster = make_cluster(1)
    (frozen,) = nodes_of(cluster)
    transport = SshTransport(ssh_config=os.devnull)
    timeout = scaled(6)  # the freeze (retries included) happens within it
    give_up = timeout + GRACE_S + SLACK_S
    try:
        feeding = _feeding(cluster, transport, frozen, scaled(60))
        _freezing_at(monkeypatch, cluster, frozen, method)
        t0 = time.monotonic()
        box = _in_thread(transport, frozen, ["true"], timeout, call=call, name="probe")
        _timed_out(box, t0, give_up + scaled(2), give_up + scaled(4))
        _ended(feeding)  # the stuck connection was closed: they end too, raising nothing
    finally:
        cluster.thaw_node(frozen.name)
        transport.close()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("call", ["run", "stream"])
def test_output_read_from_a_frozen_node_whose_socket_is_full_times_out_at_its_give_up(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch, call: str,
) -> None:
    """Reading a command's output sends window adjustments (one per ~200 KiB read); the
    node froze, its socket full (other commands' stdin), with a window's worth of output
    still to read: they block. The command is a ``timeout`` at its give-up."""
    cluster = make_cluster(1)
    (frozen,) = nodes_of(cluster, output_keep=1000)
    transport = SshTransport(ssh_config=os.devnull)
    timeout = scaled(6)  # the freeze (retries included) happens within it
    give_up = timeout + GRACE_S + SLACK_S
    try:
        feeding = _feeding(cluster, transport, frozen, scaled(60))
        _freezing_at(monkeypatch, cluster, frozen, "recv", when=lambda chan: len(chan.in_buffer) >= 1 << 20)
        t0 = time.monotonic()
        box = _in_thread(transport, frozen, ["sh", "-c", "exec cat /dev/zero"], timeout, call=call,
                         name="probe")
        _timed_out(box, t0, give_up + scaled(2), give_up + scaled(4))
        _ended(feeding)
    finally:
        cluster.thaw_node(frozen.name)
        transport.close()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_frozen_node_behind_a_jump_host_whose_connection_cannot_send_is_caught_by_keepalives(
    make_cluster: MakeCluster,
) -> None:
    """Behind a jump host no TCP_USER_TIMEOUT guards the node's connection; a keepalive that
    cannot be sent (the connection is stuck sending stdin) counts as unanswered, rather than
    holding paramiko's reader thread, so 3 of them close the connection."""
    cluster = make_cluster(2)
    jump, target = cluster.names
    (node,) = nodes_of(cluster, [target], proxy_jump=f"root@{cluster.address(jump)}:{cluster.port}")
    transport = SshTransport(ssh_config=os.devnull, keepalive=1)
    try:
        feeding = _frozen_mid_stdin(cluster, transport, node, scaled(30))
        frozen_at = time.monotonic()
        for run in feeding:
            run["thread"].join(max(0.0, frozen_at + scaled(12) - time.monotonic()))  # type: ignore[attr-defined]
            r = run.get("result")
            assert isinstance(r, RunResult), (time.monotonic() - frozen_at, run)
            assert r.state is NodeState.UNREACHABLE and "connection lost" in r.stderr, r
            # ~(3 + 1) keepalive intervals, not the commands' 30 s
            assert float(run["at"]) - frozen_at <= scaled(8)  # type: ignore[arg-type]
        r = transport.run(nodes_of(cluster, [jump])[0], ["true"], timeout=scaled(10))
        assert r.state is NodeState.OK, r  # the jump host's own connection is fine
    finally:
        cluster.thaw_node(target)
        transport.close()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_command_overdue_on_a_busy_connection_that_can_send_leaves_it_to_the_others(
    make_cluster: MakeCluster,
) -> None:
    """A command given up on (its reaper stopped: no exit status) while the node is busy
    taking other commands' stdin on the same connection: the connection is not stuck, so
    it stays, and so do they. Frozen, it is found stuck."""
    cluster = make_cluster(1)
    (node,) = nodes_of(cluster)
    transport = SshTransport(ssh_config=os.devnull)
    timeout = scaled(3)
    reaper = r"^/bin/sh -c [\s\S]*\bsleep 1161\b"  # the supervising shell (wrap.START)
    try:
        feeding = _feeding(cluster, transport, node, scaled(120), size=2 << 30)  # busy all along
        box = _in_thread(transport, node, ["sleep", "1161"], timeout)
        assert _wait_for(lambda: cluster.node_pids(node.name, reaper), scaled(2))
        for pid in cluster.node_pids(node.name, reaper):
            os.kill(pid, signal.SIGSTOP)  # it will neither kill the command nor report
        box["thread"].join(timeout + GRACE_S + SLACK_S + scaled(3))  # type: ignore[attr-defined]
        r = box.get("result")
        assert isinstance(r, RunResult) and r.state is NodeState.TIMEOUT, r
        assert "gave up on the node" in r.stderr, r
        assert len(cluster.node_pids(node.name, r"^cat\b")) == FEEDERS
        assert not any("result" in run for run in feeding)  # still being fed, on the same connection
        conn, new = transport._connector.connection(transport.endpoint(node))
        assert not new and transport.connections_opened == 1
        assert not any(cannot_send(conn) for _ in range(5))  # busy, but sending
        _freeze_full(cluster, node)
        assert cannot_send(conn)
    finally:
        cluster.thaw_node(node.name)
        transport.close()


def test_ctrl_c_on_brctl_exec_leaves_no_remote_process(
    ssh_cluster: SshCluster, tmp_path: Path,
) -> None:
    inv = ssh_cluster.write_inventory(tmp_path, names=["node01", "node04"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "brctl", "-i", str(inv), "exec", "--",
         "sh", "-c", "setsid sleep 1031 & sleep 1032"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        def running() -> bool:
            return all(len(ssh_cluster.node_pids(n, r"^sleep 103[12]")) == 2 for n in ("node01", "node04"))

        assert _wait_for(running, scaled(20)), proc.stderr
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=scaled(8))
        assert proc.returncode == 130, err
        assert b"killed" in err
        assert time.monotonic() - t0 <= scaled(6)
        gone = lambda: not any(ssh_cluster.node_pids(n, r"sleep 103[12]") for n in ("node01", "node04"))  # noqa: E731
        assert _wait_for(gone, scaled(3))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# In the child scripts: this process's own peak RSS in MiB. VmHWM, not getrusage's
# ru_maxrss: Linux carries ru_maxrss across execve, so a child of a big pytest worker
# reported the worker's 479 MiB.
_PEAK_MIB = """
def peak_mib():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) >> 10
"""

_PEAK_RSS = _PEAK_MIB + """
import os, sys, tracemalloc
from brctl.core.transport import Node
from brctl.remote.ssh.transport import SshTransport
node = Node(name="n", address=sys.argv[1], port=int(sys.argv[2]), identity_file=sys.argv[3],
            known_hosts=sys.argv[4], connect_timeout=float(sys.argv[5]))
t = SshTransport(ssh_config=os.devnull)
tracemalloc.start()
r = t.run(node, ["sh", "-c", "head -c 200000000 /dev/zero | tr '\\\\0' x; echo; echo end"],
          timeout=float(sys.argv[6]))
print(r.state.value, len(r.stdout), r.stdout[-4:] == "end\\n", "200000005 bytes in all" in r.stdout,
      tracemalloc.get_traced_memory()[1] >> 20, peak_mib())
"""


@pytest.mark.slow
def test_200_mb_of_output_is_kept_head_and_tail_in_bounded_memory(ssh_cluster: SshCluster) -> None:
    node = nodes_of(ssh_cluster, ["node01"])[0]
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, node.address, str(node.port), str(node.identity_file),
         str(node.known_hosts), str(scaled(10)), str(scaled(120))],
        cwd=REPO, capture_output=True, text=True, timeout=scaled(150), check=True,
    ).stdout.split()
    state, kept, tail_ok, counted, peak_mib, rss_mib = out[0], int(out[1]), out[2], out[3], int(out[4]), out[5]
    assert state == "ok"
    assert 4 << 20 <= kept <= (4 << 20) + 200  # the first and last 2 MiB and the marker
    assert tail_ok == "True" and counted == "True"
    # The most Python held at once (paramiko's buffers included): 2 x 2 MiB kept, the channel
    # window, chunks in flight. Keeping every chunk was 647 MiB of RSS.
    assert peak_mib <= 32, (peak_mib, rss_mib)
    # And the process's own peak RSS (_PEAK_MIB): 53 MiB measured (interpreter, paramiko, the
    # kept text), far below keeping every chunk (647 MiB).
    assert int(rss_mib) <= 128, (peak_mib, rss_mib)


class _NoPython3Cluster(SshCluster):
    """Machines whose login PATH has a shell and coreutils but no ``python3`` (a conda-only
    node: its interpreter is the inventory's ``python``)."""

    def _sshd_config(self, name: str) -> str:
        bin_dir = self.root / "bin"
        if not bin_dir.exists():
            bin_dir.mkdir()
            for tool in ("sh", "env", "echo", "sleep", "cat"):
                found = shutil.which(tool)
                assert found is not None, tool
                (bin_dir / tool).symlink_to(found)
        return super()._sshd_config(name) + f"SetEnv PATH={bin_dir}\n"


def test_a_node_without_python3_runs_the_reaper_with_its_configured_python(tmp_path: Path) -> None:
    cluster = _NoPython3Cluster(tmp_path, 1).start()
    transport = SshTransport(ssh_config=os.devnull)
    try:
        bare = nodes_of(cluster)[0]
        probe = transport.run(bare, ["sh", "-c", "command -v python3 || echo none"], timeout=scaled(10))
        assert probe.exit_code == 127  # the default: the reaper's own python3 is not there
        node = dataclasses.replace(bare, python=sys.executable)
        res = transport.run(node, ["sh", "-c", "command -v python3 || echo none"], timeout=scaled(10))
        assert (res.state, res.stdout) == (NodeState.OK, "none\n"), res
        res = transport.run(node, ["sleep", "30"], timeout=scaled(1))
        assert res.state is NodeState.TIMEOUT, res  # the reaper (under that python) killed it
    finally:
        transport.close()
        cluster.stop()


def test_a_node_with_python3_runs_the_reaper_with_it_whatever_python_says(
    ssh_cluster: SshCluster,
) -> None:
    # A configured python may be one the job user can write: the probes check it before
    # they run it as root, the reaper could not, so python3 runs it wherever there is one.
    node = nodes_of(ssh_cluster, ["node01"], python="/nonexistent/python")[0]
    transport = SshTransport(ssh_config=os.devnull)
    try:
        res = transport.run(node, ["echo", "fine"], timeout=scaled(10))
    finally:
        transport.close()
    assert (res.state, res.stdout) == (NodeState.OK, "fine\n"), res


def _local_inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text("nodes:\n  - {name: here, connection: local}\n")
    return path


def test_a_second_ctrl_c_exits_at_once(tmp_path: Path) -> None:
    inv, started = _local_inventory(tmp_path), tmp_path / "started"
    # A command that ignores SIGTERM: the reaper gives it GRACE_S before its SIGKILL, and
    # the first Ctrl-C waits for that report.
    script = f"trap '' TERM; touch {started}; sleep 1061"

    def start() -> subprocess.Popen[bytes]:
        started.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-m", "brctl", "-i", str(inv), "exec", "--", "sh", "-c",
                                 script], cwd=REPO, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert _wait_for(started.exists, scaled(20))
        return proc

    try:
        proc = start()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=scaled(10))
        once = time.monotonic() - t0
        assert proc.returncode == 130 and b"killed" in err, err
        assert once >= GRACE_S * 0.9  # it waited for the kill's report

        proc = start()
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        t1 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=scaled(10))
        assert proc.returncode == 130, err
        assert time.monotonic() - t1 <= scaled(1)  # at once: no wait for the reports
        assert _wait_for(lambda: not local_pids(r"^sleep 1061"), scaled(5))  # the reaper finished
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


_SHARDED = """
import sys
from brctl.core.errors import InterruptedRun
from brctl.core.transport import Node
from brctl.remote.local import LocalTransport
from brctl.remote.shard import run_sharded
nodes = [Node(name=f"n{i}", address="x", connection="local") for i in range(2)]
try:
    run_sharded(LocalTransport, nodes, ["sh", "-c", "trap '' TERM; touch %s/$$; sleep 1071"],
                processes=2, timeout=60)
except InterruptedRun as exc:
    print(exc.message)
"""


def test_ctrl_c_on_a_sharded_fan_out_kills_the_commands_and_says_so(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _SHARDED % tmp_path], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert _wait_for(lambda: len(list(tmp_path.iterdir())) == 2, scaled(30)), proc.stderr
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)  # to the parent only, as kill(1) does
        out, err = proc.communicate(timeout=scaled(15))
        assert "commands still running were killed" in out.decode(), (out, err)
        assert b"Traceback" not in err, err
        assert not local_pids(r"^sleep 1071")  # killed before it returned: the cancel path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in local_pids(r"^sleep 1071"):
            os.kill(pid, signal.SIGKILL)


def test_a_local_stream_is_bounded_reaped_and_cancelled(tmp_path: Path) -> None:
    node = Node(name="here", address="here", connection="local", output_keep=1000)
    transport = LocalTransport()
    res = transport.stream(node, ["sh", "-c", "head -c 50000000 /dev/zero"], timeout=scaled(30))
    assert res.state is NodeState.OK and res.stdout_total == 50_000_000 and len(res.stdout) < 2200
    # a timeout kills the whole tree, setsid escapees included
    with open(tmp_path / "out", "wb") as sink:
        res = transport.stream(node, ["sh", "-c", "setsid sleep 1091 & sleep 1092"],
                               timeout=scaled(1), stdout=sink)
    assert res.state is NodeState.TIMEOUT, res
    assert _wait_for(lambda: not local_pids(r"^sleep 109[12]"), scaled(3))
    # cancel (Ctrl-C) reaches a running stream
    box: dict[str, RunResult] = {}
    runner = threading.Thread(target=lambda: box.setdefault("r", transport.stream(
        node, ["sh", "-c", "setsid sleep 1093 & sleep 1094"], timeout=scaled(60))))
    runner.start()
    assert _wait_for(lambda: len(local_pids(r"^sleep 109[34]")) == 2, scaled(10))
    transport.cancel()
    runner.join(scaled(5))
    assert not runner.is_alive() and box["r"].state is NodeState.TIMEOUT, box
    assert _wait_for(lambda: not local_pids(r"^sleep 109[34]"), scaled(3))


def test_cancel_reaches_an_ssh_stream(ssh_cluster: SshCluster, tmp_path: Path) -> None:
    node = nodes_of(ssh_cluster, ["node02"])[0]
    transport = SshTransport(ssh_config=os.devnull)
    box: dict[str, object] = {}
    try:
        with open(tmp_path / "out", "wb") as sink:
            def go() -> None:
                box["r"] = transport.stream(node, ["sleep", "1101"], timeout=scaled(60), stdout=sink)
                box["at"] = time.monotonic()

            runner = threading.Thread(target=go, daemon=True)
            runner.start()
            assert _wait_for(lambda: ssh_cluster.node_pids("node02", r"^sleep 1101"), scaled(10))
            t0 = time.monotonic()
            transport.cancel()
            runner.join(scaled(5))
        assert not runner.is_alive()
        assert float(box["at"]) - t0 <= scaled(1)  # type: ignore[arg-type]
        assert box["r"].state is NodeState.TIMEOUT, box  # type: ignore[attr-defined]
        assert _wait_for(lambda: not ssh_cluster.node_pids("node02", r"^sleep 1101"), scaled(3))
    finally:
        transport.close()


def test_an_ssh_stream_whose_command_writes_much_to_stderr_does_not_stall(
    ssh_cluster: SshCluster,
) -> None:
    # Unread stderr fills the channel's window (2 MiB) and stops the command: a shard copy
    # with a chatty stderr was a "stalled" timeout. Both streams are read as they come.
    node = nodes_of(ssh_cluster, ["node03"], output_keep=1000)[0]
    transport = SshTransport(ssh_config=os.devnull)
    try:
        sink = io.BytesIO()
        t0 = time.monotonic()
        res = transport.stream(node, ["sh", "-c", "head -c 5000000 /dev/zero >&2; echo done"],
                               timeout=scaled(30), stdout=sink)
        assert res.state is NodeState.OK, res
        assert time.monotonic() - t0 <= scaled(10)
        assert sink.getvalue() == b"done\n"
        assert res.stderr_total == 5_000_000 and len(res.stderr) < 2200
    finally:
        transport.close()


_FANOUT_RSS = _PEAK_MIB + """
import sys
from brctl.core.transport import Node
from brctl.remote.fanout import run_all
from brctl.remote.local import LocalTransport
keep, size, fanout = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
nodes = [Node(name=f"n{i:02d}", address="x", connection="local", output_keep=keep) for i in range(fanout)]
transport = LocalTransport()
run_all(transport, nodes, ["true"], concurrency=fanout, timeout=60)
base = peak_mib()
spew = f"head -c {size} /dev/zero | tr '\\\\0' x; head -c {size} /dev/zero >&2"
results = run_all(transport, nodes, ["sh", "-c", spew], concurrency=fanout, timeout=float(sys.argv[4]))
peak = peak_mib()
whole = all(r.stdout_total == size and r.stderr_total == size for r in results.values())
print(base, peak, whole)
"""


def test_fan_out_memory_is_fanout_times_the_kept_bytes() -> None:
    """16 machines printing 20 MB on each stream at once: 640 MB through the controller."""
    keep, size, fanout = 1 << 20, 20_000_000, 16
    out = subprocess.run(
        [sys.executable, "-c", _FANOUT_RSS, str(keep), str(size), str(fanout), str(scaled(120))],
        cwd=REPO, capture_output=True, text=True, timeout=scaled(150), check=True,
        env={**os.environ, "MALLOC_ARENA_MAX": "2"},
    ).stdout.split()
    base, peak, whole = int(out[0]), int(out[1]), out[2]
    assert whole == "True"  # every stream counted to its end
    kept_mib = fanout * 2 * 2 * keep >> 20  # nodes x streams x (head + tail)
    # Measured: 107 MiB above a 16 MiB base for 64 MiB kept (the bytes, their text, a chunk
    # in flight per stream); keeping everything would be 640 MiB and more.
    assert peak - base <= 3 * kept_mib, (base, peak, kept_mib)


def test_a_double_forked_setsid_process_is_killed_with_the_timeout() -> None:
    # The grandchild setsid()s and loses its parent at once: reparented to the reaper (a child
    # subreaper), it is found by the walk and killed with the rest of the tree.
    node = Node(name="here", address="here", connection="local")
    script = "(setsid sh -c 'sleep 1121 & exit' &); sleep 1122"
    res = LocalTransport().run(node, ["sh", "-c", script], timeout=scaled(1))
    assert res.state is NodeState.TIMEOUT, res
    assert _wait_for(lambda: not local_pids(r"^sleep 112[12]"), scaled(3))
