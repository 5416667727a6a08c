"""``SshTransport``: the paramiko backend of the Transport protocol (production).

It and the two modules it is built from are the only ones that import paramiko;
``brctl.remote.factory`` imports it lazily. ``brctl.remote.ssh.config`` resolves a
node to an ``Endpoint`` through the inventory and ``~/.ssh/config`` (Include,
Match, ProxyJump, ProxyCommand, IdentityFile, known_hosts files);
``brctl.remote.ssh.connect`` opens, authenticates (host keys, credentials) and
caches the connections, with their connect-time states and timeouts. This module
runs commands and streams bulk data over them.

Connections. One authenticated connection per (user, host, port, route) is
opened on first use and reused by every later ``run``/``stream`` until
``close()`` (the daemon keeps one SshTransport across polls). A cached connection
found dead is reopened once; a command is never re-run.

Timeouts. ``connect_timeout`` bounds TCP connect + banner + key exchange + auth
(retries included). The command runs under the node-side reaper
(``brctl.remote.wrap``: ``python3`` on the node, else the node's ``python``): at T it kills the whole tree the
command started (SIGTERM, SIGKILL 2 s later; ``setsid`` escapees included) and
exits 124, reported as ``timeout`` whatever the command did with SIGTERM. A
closed channel (``cancel()`` on Ctrl-C, a dead controller) makes it do the same.
The controller gives up ``GRACE_S + SLACK_S`` after T, waiting for the node's
answer to the exec request included (paramiko alone would wait for ever).

Prompt and bounded. The read loop blocks on the channel and ends on EOF with the
exit status, on the channel closing, or on the connection dying: a connection
lost mid-command is ``unreachable`` ("connection lost while running") as soon as
paramiko sees it (a silent loss through keepalives: ``brctl.remote.ssh.connect``).
Output is kept per stream as its first and last ``node.output_keep`` bytes
(``brctl.core.capture``).

States. Connection failures keep the state ``ssh_connect`` gives them
(``unreachable``, ``timeout``, ``auth``, ``hostkey``); non-zero exit →
``failed``. The stderr of a result that never ran is one short line.
"""

from __future__ import annotations

import contextlib
import functools
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

from brctl.core.capture import Capture
from brctl.core.transport import Node, NodeState, RunResult, with_env
from brctl.remote.ssh.config import Endpoint, EndpointResolver
from brctl.remote.ssh.connect import KEEPALIVE_S, ConnectError, Connector
from brctl.remote.ssh.known_hosts import KnownHostsError
from brctl.remote.ssh.liveness import Watch
from brctl.remote.ssh.openssh import SshConfigError
from brctl.remote.ssh.paramiko_lite import paramiko
from brctl.remote.wrap import GRACE_S, SLACK_S, exit_state, shell_line

LINGER_S = 1.0  # after the exit status, how long output may still arrive (a background child)
OPENSSH_AT_ONCE = 16  # ssh -G processes resolving Match exec hosts concurrently (check_config)
STDIN_SLICE = 1 << 20  # bytes per sendall; see _exec


def _feed(chan: paramiko.Channel, data: bytes) -> None:
    """Send ``data`` as the command's stdin, then EOF; errors end it quietly.

    paramiko's sendall re-slices what is left after every 32 KiB packet, which is
    quadratic (a 200 MB stdin copied ~6,000 times): it gets 1 MiB slices instead.
    A command that exits without reading everything closes the channel under us:
    its exit status, read by the caller, is what counts.
    """
    try:
        for start in range(0, len(data), STDIN_SLICE):
            chan.sendall(data[start:start + STDIN_SLICE])
        chan.shutdown_write()
    except (OSError, EOFError, paramiko.SSHException):
        pass


def _exec_request(chan: paramiko.Channel, cmd: str, watch: Watch) -> None:
    """``chan.exec_command(cmd)``, its answer awaited until ``watch`` fires at most.

    paramiko awaits the answer for ever, and a wedged or hostile sshd that answers
    keepalives need never send it: then the channel is closed under the wait (and
    a request that cannot even be sent ends with its stuck connection).

    Raises:
        socket.timeout: no answer by ``watch``'s time.
        paramiko.SSHException: the request was refused, or the channel closed (``cancel``).
    """
    watch.then = functools.partial(_let_go, chan)  # closing may block: see _let_go
    try:
        # An argument that is not UTF-8 (bytes the shell gave us, kept as surrogates) goes
        # as its bytes, as ssh sends it; paramiko's own encoding refuses it.
        chan.exec_command(cmd.encode("utf-8", "surrogateescape"))
    except (paramiko.SSHException, EOFError, OSError):
        if watch.fired:
            raise socket.timeout() from None
        raise
    finally:
        watch.then = None


def _drain(chan: paramiko.Channel, out: Capture, err: Capture) -> None:
    """Move whatever the channel holds into the captures."""
    while chan.recv_ready():
        out.add(chan.recv(65536))
    while chan.recv_stderr_ready():
        err.add(chan.recv_stderr(65536))


def _read_to_end(chan: paramiko.Channel, out: Capture, err: Capture, give_up: float) -> None:
    """Read the channel until EOF with an exit status, an exit status and ``LINGER_S``
    without EOF (a background child holds stdout), the channel closed (a lost
    connection, ``cancel``) or the connection dead; block between events, never spin.

    Raises:
        socket.timeout: ``give_up`` passed first.
    """
    fd = chan.fileno()  # an OS pipe paramiko signals when data arrives
    exited = None
    while True:
        _drain(chan, out, err)
        now = time.monotonic()
        if chan.closed or not _alive(chan):
            break
        if chan.exit_status != -1:
            if chan.eof_received:
                break
            exited = exited or now
            if now - exited >= LINGER_S:
                break
        left = give_up - now
        if left <= 0:
            raise socket.timeout()
        if chan.eof_received:  # the pipe stays set after EOF: wait on the status
            chan.status_event.wait(min(left, LINGER_S))
        else:
            select.select([fd], [], [], min(left, LINGER_S))
    _drain(chan, out, err)


def _alive(chan: paramiko.Channel) -> bool:
    transport = chan.get_transport()
    return transport is not None and transport.is_active()


def _copy_out(chan: paramiko.Channel, stdout: BinaryIO | None, out: Capture) -> None:
    """The channel's stdout to its end: into ``stdout``, or kept bounded in ``out``."""
    while True:
        data = chan.recv(STDIN_SLICE)
        if not data:
            return
        if stdout is None:
            out.add(data)
        else:
            stdout.write(data)


def _close_quietly(chan: paramiko.Channel) -> None:
    """Close ``chan`` from a timer's or ``_let_go``'s thread: a connection already dead makes
    paramiko raise there, which would print a traceback on the operator's stderr."""
    with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
        chan.close()


def _let_go(chan: paramiko.Channel) -> None:
    """Close ``chan`` without waiting for it: from its own thread unless closed already.

    ``close()`` sends CHANNEL_CLOSE, which blocks while the connection cannot send (a
    frozen node whose socket is full) until the kernel drops it (TCP_USER_TIMEOUT) and
    then raises: a result would wait, a fan-out slot with it, and a Ctrl-C would reach
    each node only after the one before. A close stuck so ends, quietly, when its
    connection goes.
    """
    if chan.closed:  # the node closed it (a command that ended): nothing to send
        return
    try:
        threading.Thread(target=_close_quietly, args=(chan,), daemon=True, name="brctl-close").start()
    except RuntimeError:  # no thread to be had: close it here
        _close_quietly(chan)


def _copy_err(chan: paramiko.Channel, err: Capture) -> None:
    """The channel's stderr to its end, kept bounded in ``err``; read beside stdout, since
    unread stderr fills the channel's window and stops the command's stdout too."""
    while True:
        try:
            data = chan.recv_stderr(65536)
        except socket.timeout:
            continue  # quiet for the channel's timeout: the stdout side judges stalls
        except (OSError, EOFError, paramiko.SSHException):
            return
        if not data:  # EOF, or closed (which ends every stream: see stream's finally)
            return
        err.add(data)


def _pump(src: BinaryIO, chan: paramiko.Channel) -> None:
    """Copy ``src`` into the channel as stdin, then EOF; errors end it quietly (see ``_feed``)."""
    try:
        while True:
            block = src.read(STDIN_SLICE)
            if not block:
                break
            chan.sendall(block)
        chan.shutdown_write()
    except (OSError, EOFError, ValueError, paramiko.SSHException):
        pass


def _result(node: str, state: NodeState, t0: float, stderr: str, exit_code: int | None = None) -> RunResult:
    return RunResult(node, state, exit_code, "", stderr, time.monotonic() - t0)


class SshTransport:
    """The production Transport: paramiko, thread-safe, connections cached per node.

    Args:
        connect_rate: new connections per second, at most (all nodes together).
        ssh_config: ssh config file; None → ``~/.ssh/config`` if it exists;
            ``os.devnull`` to ignore any.
        connect_retries: extra attempts after a connection-level failure.
        keepalive: seconds between keepalives on open connections (0: off).
    """

    def __init__(
        self,
        *,
        connect_rate: float = 100.0,
        ssh_config: str | None = None,
        connect_retries: int = 2,
        keepalive: int = KEEPALIVE_S,
    ) -> None:
        self._connect_rate = connect_rate
        self._retries = connect_retries
        self._keepalive = keepalive
        self._config_arg = ssh_config
        self._resolver = EndpointResolver(ssh_config)
        self._connector = Connector(
            connect_rate=connect_rate, connect_retries=connect_retries, keepalive=keepalive
        )
        self._lock = threading.Lock()
        self._running: set[paramiko.Channel] = set()
        self._cancelled = False

    @property
    def connections_opened(self) -> int:
        """Connections opened so far (for tests and benchmarks)."""
        return self._connector.connections_opened

    def process_factory(self, processes: int) -> Callable[[], SshTransport]:
        """A picklable maker of an equivalent transport for one of ``processes`` workers.

        Each worker gets its share of ``connect_rate``, so the cap stays global.
        """
        return functools.partial(
            SshTransport,
            connect_rate=self._connect_rate / max(1, processes),
            ssh_config=self._config_arg,
            connect_retries=self._retries,
            keepalive=self._keepalive,
        )

    # -- resolution ---------------------------------------------------------------

    def endpoint(self, node: Node) -> Endpoint:
        """Where and how to connect for ``node`` (inventory + ssh config; cached).

        Raises:
            SshConfigError: a setting brctl cannot honour or read for this node (exit 2).
        """
        return self._resolver.endpoint(node)

    def check_config(self, nodes: Sequence[Node]) -> None:
        """Resolve the ssh config of the nodes about to be contacted, before any fan-out.

        Raises:
            SshConfigError: a setting brctl cannot honour for one of them (exit 2,
                naming every such host); the config of hosts not contacted is never judged.
        """
        todo = [n for n in nodes if n.connection == "ssh"]
        if self._resolver.spawns() and len(todo) > 1:  # ssh -G per such host: a few at once
            with ThreadPoolExecutor(OPENSSH_AT_ONCE, thread_name_prefix="brctl-ssh-G") as pool:
                outcomes = list(pool.map(self._config_problem, todo))
        else:
            outcomes = [self._config_problem(n) for n in todo]
        problems = [p for p in outcomes if p is not None]
        if problems:
            more = f" (and {len(problems) - 3} more hosts)" if len(problems) > 3 else ""
            raise SshConfigError("; ".join(p.message for p in problems[:3]) + more, hint=problems[0].hint)

    def _config_problem(self, node: Node) -> SshConfigError | None:
        try:
            self.endpoint(node)
        except SshConfigError as exc:
            return exc
        return None

    def preload(self, nodes: Sequence[Node]) -> None:
        """Parse every node's known_hosts now, so a malformed file fails before fan-out.

        Raises:
            KnownHostsError: a malformed line (an InputError: exit 2, names file:line).
        """
        for node in nodes:
            if node.connection == "ssh":
                try:
                    ep = self.endpoint(node)
                except SshConfigError:
                    continue  # judged when that node is contacted (one bad host spoils no other)
                self._connector.known.load_all(ep.known_hosts)

    # -- running ------------------------------------------------------------------

    def _session(self, node: Node, t0: float) -> tuple[paramiko.Channel | None, RunResult | None]:
        """An open session channel on the node, or the result that says why not."""
        try:
            ep = self.endpoint(node)
        except SshConfigError as exc:  # run_all refuses these before any fan-out (check_config)
            return None, _result(node.name, NodeState.UNREACHABLE, t0, exc.message)
        for attempt in (0, 1):
            try:
                conn, new = self._connector.connection(ep)
            except ConnectError as exc:
                return None, _result(node.name, exc.state, t0, exc.message)
            except KnownHostsError as exc:
                return None, _result(node.name, NodeState.HOSTKEY, t0, exc.message)
            asked = time.monotonic()
            # The request may not even go out (a frozen node whose socket is full): see Watch.
            watch = Watch(conn, asked + ep.connect_timeout)
            try:
                with watch:
                    return conn.open_session(timeout=ep.connect_timeout), None
            except paramiko.ChannelException as exc:  # e.g. MaxSessions: the connection is fine
                return None, _result(node.name, NodeState.UNREACHABLE, t0, f"session refused: {exc}")
            except (paramiko.SSHException, EOFError, OSError) as exc:
                hung = watch.fired or (
                    conn.is_active() and time.monotonic() - asked >= ep.connect_timeout * 0.95)
                self._connector.drop(ep, conn)
                if hung:
                    # Alive but silent (a hung or frozen node): a new connection would
                    # only hang as well, so report it rather than pay the timeout twice.
                    return None, _result(
                        node.name, NodeState.TIMEOUT, t0,
                        f"no answer to a session request within {ep.connect_timeout:g}s (node hung?)",
                    )  # fmt: skip
                if new or attempt:
                    return None, _result(
                        node.name, NodeState.UNREACHABLE, t0, f"could not open a session: {exc}"
                    )
                # A cached connection died since its last use: reopen it once.
        raise AssertionError("unreachable")

    def cancel(self) -> None:
        """Stop every running command (Ctrl-C): close their channels, start no more.

        The node-side reaper sees its channel go and kills the command's whole tree.
        """
        with self._lock:
            self._cancelled = True
            running = list(self._running)
        for chan in running:  # none waits for another: see _let_go
            _let_go(chan)

    def _track(self, chan: paramiko.Channel, add: bool) -> None:
        with self._lock:
            if add:
                self._running.add(chan)
            else:
                self._running.discard(chan)
        if add and self._cancelled:  # cancelled while this one was opening
            _let_go(chan)

    def run(
        self, node: Node, argv: Sequence[str], *, timeout: float, stdin: bytes | None = None
    ) -> RunResult:
        """Run ``argv`` on ``node``; see the module docstring for states and timeouts."""
        t0 = time.monotonic()
        if self._cancelled:
            return _result(node.name, NodeState.TIMEOUT, t0, "brctl: interrupted before start")
        chan, failed = self._session(node, t0)
        if chan is None:
            assert failed is not None
            return failed
        self._track(chan, True)
        cmd = shell_line(node.python, with_env(argv, node.env), timeout)
        try:
            return self._exec(node, chan, cmd, stdin, timeout, t0)
        finally:
            self._track(chan, False)
            _let_go(chan)

    def _exec(
        self,
        node: Node,
        chan: paramiko.Channel,
        cmd: str,
        stdin: bytes | None,
        timeout: float,
        t0: float,
    ) -> RunResult:
        """Run ``cmd`` on the open channel and read its output, bounded, to the end.

        See ``_read_to_end``; the state comes from the exit status, or from why
        there is none.
        """
        started = time.monotonic()
        give_up = started + timeout + GRACE_S + SLACK_S
        out, err = Capture(node.output_keep), Capture(node.output_keep)

        def gave_up() -> RunResult:
            return RunResult.captured(
                node.name, NodeState.TIMEOUT, None, out, err, time.monotonic() - t0,
                note=f"brctl: no exit status {timeout:g}s+{GRACE_S + SLACK_S:g}s after start; "
                "gave up on the node\n",
            )  # fmt: skip

        # Every send below may block (the connection cannot send): the watch bounds them.
        with Watch(chan.get_transport(), give_up) as watch:
            try:
                chan.settimeout(max(0.01, give_up - time.monotonic()))
                _exec_request(chan, cmd, watch)
                # stdin is fed from its own thread while this one drains stdout/stderr: a
                # command that writes back while it reads (cat) would otherwise fill its
                # output window and stop reading, and both sides would wait forever.
                if stdin:
                    threading.Thread(target=_feed, args=(chan, stdin), daemon=True,
                                     name=f"brctl-stdin-{node.name}").start()
                else:
                    chan.shutdown_write()
                _read_to_end(chan, out, err, give_up)
            except (socket.timeout, TimeoutError):
                return gave_up()
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if watch.fired:  # a send blocked past the give-up, until its stuck connection closed
                    return gave_up()
                if not self._cancelled:  # else cancel() closed the channel under us
                    why = f"connection lost while running: {exc}"
                    return _result(node.name, NodeState.UNREACHABLE, t0, why)
        code = chan.exit_status
        seconds = time.monotonic() - t0
        if code == -1 and watch.fired:  # the watch closed its channel or connection
            return gave_up()
        if code == -1:  # no exit status: why did the channel end?
            if self._cancelled:
                state, why = NodeState.TIMEOUT, "interrupted; the command was killed"
            elif not _alive(chan):
                state, why = NodeState.UNREACHABLE, "connection lost while running"
            else:
                state, why = NodeState.FAILED, "the command ended without an exit status"
            return RunResult.captured(node.name, state, None, out, err, seconds, note=f"brctl: {why}\n")
        state = exit_state(code, time.monotonic() - started, timeout)
        return RunResult.captured(node.name, state, None if state is NodeState.TIMEOUT else code,
                                  out, err, seconds)

    # -- files --------------------------------------------------------------------

    def stream(
        self, node: Node, argv: Sequence[str], *, timeout: float,
        stdin: BinaryIO | None = None, stdout: BinaryIO | None = None,
    ) -> RunResult:
        """Run ``argv`` with bulk stdin/stdout files (checkpoint shards): see ``Transport.stream``.

        Under the reaper like ``run``; the channel's own timeout is ``timeout`` too,
        so a stream that stops moving for that long is a ``timeout``. stderr is read
        beside it, kept bounded. A ``stdout`` that stops taking data
        (the other end of a relay died) closes the channel: the command gets SIGPIPE.
        """
        t0 = time.monotonic()
        if self._cancelled:
            return _result(node.name, NodeState.TIMEOUT, t0, "brctl: interrupted before start")
        chan, failed = self._session(node, t0)
        if chan is None:
            assert failed is not None
            return failed
        self._track(chan, True)  # cancel() closes it: the reaper kills the tree
        cmd = shell_line(node.python, with_env(argv, node.env), timeout)
        out, err = Capture(node.output_keep), Capture(node.output_keep)
        stalled = f"stream stalled or ran past {timeout:g}s"
        # Every send below may block (the connection cannot send): the watch bounds them.
        with Watch(chan.get_transport(), time.monotonic() + timeout + GRACE_S + SLACK_S) as watch:
            try:
                chan.settimeout(timeout + GRACE_S + SLACK_S)
                _exec_request(chan, cmd, watch)
                if stdin is not None:
                    threading.Thread(target=_pump, args=(stdin, chan), daemon=True,
                                     name=f"brctl-stream-{node.name}").start()
                else:
                    chan.shutdown_write()
                errors = threading.Thread(target=_copy_err, args=(chan, err), daemon=True,
                                          name=f"brctl-stderr-{node.name}")
                errors.start()
                _copy_out(chan, stdout, out)
                if self._cancelled and chan.closed:  # cancel() closed it: no status will come
                    return _result(node.name, NodeState.TIMEOUT, t0, "interrupted; the command was killed")
                if not chan.status_event.wait(SLACK_S + GRACE_S):
                    raise socket.timeout()
                errors.join(SLACK_S)  # stdout's EOF is stderr's too: it ends at once
            except (socket.timeout, TimeoutError):
                return _result(node.name, NodeState.TIMEOUT, t0, stalled)
            except BrokenPipeError:
                gone = "the receiving end of the stream went away"
                return _result(node.name, NodeState.FAILED, t0, gone, 1)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if watch.fired:  # a send blocked past the give-up, until its stuck connection closed
                    return _result(node.name, NodeState.TIMEOUT, t0, stalled)
                return self._lost(node, t0, f"connection lost while streaming: {exc}")
            finally:
                self._track(chan, False)
                _let_go(chan)
        code = chan.exit_status
        if code == -1 and watch.fired:  # the watch closed its channel or connection
            return _result(node.name, NodeState.TIMEOUT, t0, stalled)
        if code == -1:
            return self._lost(node, t0, "connection lost while streaming")
        return RunResult.captured(node.name, exit_state(code, time.monotonic() - t0, timeout), code,
                                  out, err, time.monotonic() - t0)

    def _lost(self, node: Node, t0: float, why: str) -> RunResult:
        """A stream whose channel ended without a status: killed by ``cancel``, or lost."""
        if self._cancelled:
            return _result(node.name, NodeState.TIMEOUT, t0, "interrupted; the command was killed")
        return _result(node.name, NodeState.UNREACHABLE, t0, why)

    def close(self) -> None:
        """Close every connection (targets first, then jump hosts)."""
        self._connector.close()
