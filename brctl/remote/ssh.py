"""``SshTransport``: the paramiko backend of the Transport protocol (production).

The only module that imports paramiko; ``brctl.remote.factory`` imports it lazily.

Connections. One authenticated paramiko transport per (user, host, port, jump)
is opened on first use and reused by every later ``run``/``put``/``get`` until
``close()`` (the daemon keeps one SshTransport across polls). A cached connection
found dead is reopened once; a command is never re-run. Sockets are opened here
with ``TCP_NODELAY`` (without it every request/response turn waits ~40 ms on
Nagle/delayed ACK: 45 ms → 3 ms per command) and keepalives are
on. New connections are capped at ``connect_rate`` per second (a token bucket,
separate from the fan-out's concurrency) and connection-level failures (refused,
reset, lost during the handshake) are retried with capped, jittered exponential
back-off inside the connect budget; auth and host-key refusals are not retried.

Timeouts. ``connect_timeout`` bounds TCP connect + banner + key exchange + auth
(retries included). The command runs under the node-side reaper
(``brctl.remote.wrap``, ``python3`` on the node): at T it kills the whole tree the
command started (SIGTERM, SIGKILL 2 s later; ``setsid`` escapees included) and
exits 124, reported as ``timeout`` whatever the command did with SIGTERM. A
closed channel (``cancel()`` on Ctrl-C, a dead controller) makes it do the same.

Prompt and bounded. The read loop blocks on the channel and ends on EOF with the
exit status, on the channel closing, or on the connection dying: a connection
lost mid-command is ``unreachable`` ("connection lost while running") as soon as
paramiko sees it. A silent loss (power) is seen through keepalives: every
``keepalive`` seconds of silence a packet is sent, and TCP_USER_TIMEOUT drops a
connection whose packets go unacknowledged that long. Output is kept per stream
as its first and last ``node.output_keep`` bytes (``brctl.core.capture``).

States. Refused/reset/lost/no route → ``unreachable``; the connect budget spent
(TCP, or a listener that never sends a banner) → ``timeout``; the node refused
our key → ``auth``; unknown, changed or revoked host key → ``hostkey``; non-zero
exit → ``failed``. The stderr of a result that never ran is one short line.

Host keys (``brctl.remote.known_hosts``), as OpenSSH: the user files (the
inventory's ``known_hosts``, else ssh config ``UserKnownHostsFile``) and the global
ones (``GlobalKnownHostsFile``, else ``/etc/ssh/ssh_known_hosts``), looked up under
``HostKeyAlias`` when set, parsed once and indexed. ``strict`` (the default)
refuses unknown keys; ``accept-new`` trusts a host never seen before and appends
its key to ``<known_hosts>.brctl-accepted`` (the user's own file is never
written; that file is trusted only under ``accept-new``) — a changed or
``@revoked`` key is refused in both modes, and so is a host vouched for only by
``@cert-authority`` (paramiko cannot verify host certificates), never trusted on
first use.

Credentials, no prompts ever. Keys come from the inventory's ``identity_file``,
else ssh config ``IdentityFile``, else OpenSSH's default files (``~/.ssh/id_ed25519``,
``id_ecdsa``, ``id_rsa``) that exist, each with its ``<key>-cert.pub`` user
certificate when there is one; then the ssh-agent's keys (``$SSH_AUTH_SOCK``;
``ssh.agent: false`` turns that off). No agent forwarding, no passwords or
keyboard-interactive; a passphrase-protected key no agent holds is ``auth`` with
a message saying so, never a prompt. Key material never appears in messages.

``~/.ssh/config`` (path injectable: ``ssh_config``; ``None`` means
``~/.ssh/config`` when it exists, ``os.devnull`` disables it) is looked up by the
node's name, as ``ssh <name>`` would. Precedence, like OpenSSH's "command line
first": a value the inventory sets explicitly wins; a value the inventory leaves
at its default (``address`` equal to the name, ``user: root``, ``port: 22``, no
``identity_file``, no ``proxy_jump``) is taken from the ssh config when the
config has one. (The inventory cannot tell an explicit ``port: 22`` from the
default, so a config ``Port`` wins over it.) Honoured: HostName, User, Port,
IdentityFile, ProxyJump, ProxyCommand, UserKnownHostsFile, GlobalKnownHostsFile,
HostKeyAlias, in Host and Match blocks, with Include expanded as ssh does.

Jump hosts (``proxy_jump`` or ProxyJump; ``[user@]host[:port]`` hops, comma
separated as for ``ssh -J``, each resolved through the ssh config): one
authenticated connection to the jump host, every target opened as a ``direct-tcpip``
channel over it, at full fan-out. The jump host's host key is checked like any
other. paramiko has a race there: ``Channel.send`` checks ``closed`` under its lock
but sends outside it, so a target's close racing its transport's last packet puts a
data packet after our CHANNEL_CLOSE, and OpenSSH then drops the *whole* jump
connection ("data packet referred to nonexistent channel"). ``_ChannelSocket``
serialises send and close.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import logging
import os
import random
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

import paramiko

from brctl.core.capture import Capture
from brctl.core.transport import Node, NodeState, RunResult, command_line, with_env
from brctl.remote.known_hosts import (
    HostKeyStatus,
    KnownHostsCache,
    KnownHostsError,
    fingerprint,
    host_names,
)
from brctl.remote.wrap import GRACE_S, SLACK_S, exit_state, wrapped

# paramiko logs transport errors at ERROR; with no handler configured Python's
# last-resort handler would print them on brctl's stderr. Results carry the message.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

KEEPALIVE_S = 15  # detect dead peers on cached connections between daemon polls
IDLE_POLL_S = 1.0  # reader-thread wake-up interval on an established connection
LINGER_S = 1.0  # after the exit status, how long output may still arrive (a background child)
NODE_PYTHON = "python3"  # runs the reaper (brctl.remote.wrap) on every ssh node
RETRY_BASE_S = 0.1
STDIN_SLICE = 1 << 20  # bytes per sendall; see _exec
RETRY_CAP_S = 2.0
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
ACCEPTED_SUFFIX = ".brctl-accepted"
DEFAULT_USER = "root"
DEFAULT_PORT = 22
_RSA_ALGS = ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")


class _ConnectError(Exception):
    """Why a connection could not be made: the node's state and a one-line message."""

    def __init__(self, state: NodeState, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.state = state
        self.message = message
        self.retriable = retriable


@dataclass(frozen=True)
class Endpoint:
    """One SSH destination after ssh-config resolution."""

    label: str  # the node (or jump host) name, for messages
    host: str
    port: int
    user: str
    identities: tuple[str, ...]
    known_hosts: tuple[str, ...]  # every file whose keys are trusted
    accepted: str | None  # where accept-new writes a first-seen key (None: strict)
    key_names: tuple[str, ...]  # the names looked up in known_hosts (HostKeyAlias, or host/[host]:port)
    policy: str
    connect_timeout: float
    jump: Endpoint | None = field(default=None)
    proxy_command: str | None = None  # ssh config ProxyCommand (when no ProxyJump)
    agent: bool = True  # offer the ssh-agent's keys too (inventory ssh.agent)

    @property
    def key(self) -> tuple[object, ...]:
        """Connections are shared per (user, host, port, route)."""
        return (self.user, self.host, self.port, self.jump.key if self.jump else None, self.proxy_command)


class RateLimiter:
    """Token bucket: at most ``rate`` acquisitions per second, bursts up to ``burst``."""

    def __init__(self, rate: float, burst: float | None = None) -> None:
        self.rate = rate
        self.capacity = burst if burst is not None else max(1.0, rate / 10)
        self._tokens = self.capacity
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def acquire(self) -> None:
        """Block until a token is available, then take it."""
        while True:
            with self._lock:
                now = time.monotonic()
                self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
                self._last = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                wait = (1 - self._tokens) / self.rate
            time.sleep(wait)


class _ChannelSocket:
    """A direct-tcpip channel as a socket for an inner paramiko Transport.

    Holds one lock across ``send`` and ``close`` so no data can follow our
    CHANNEL_CLOSE (see the module docstring); everything else is delegated.
    """

    def __init__(self, chan: paramiko.Channel) -> None:
        self._chan = chan
        self._lock = threading.Lock()
        self._closed = False

    def send(self, data: bytes) -> int:
        with self._lock:
            if self._closed:
                raise OSError("channel closed")
            return self._chan.send(data)

    def recv(self, n: int) -> bytes:
        return self._chan.recv(n)

    def settimeout(self, timeout: float | None) -> None:
        self._chan.settimeout(timeout)

    def gettimeout(self) -> float | None:
        return self._chan.gettimeout()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._chan.close()

    def getpeername(self) -> str:
        return self._chan.getpeername()


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


GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"  # OpenSSH's default
USER_KNOWN_HOSTS = "~/.ssh/known_hosts"  # the inventory's default


def _trust(
    node: Node, cfg: paramiko.SSHConfigDict, host: str, port: int
) -> tuple[tuple[str, ...], str | None, tuple[str, ...]]:
    """Which known_hosts files, accept-new file and lookup names apply to one endpoint.

    As OpenSSH: the user files (the inventory's ``known_hosts`` when set other than
    its default, else ssh config ``UserKnownHostsFile``, else ``~/.ssh/known_hosts``),
    then the global ones (``GlobalKnownHostsFile``, else ``/etc/ssh/ssh_known_hosts``
    and ``…2``); ``HostKeyAlias`` replaces the looked-up name. The
    ``.brctl-accepted`` file beside the first user file is trusted, and written,
    only under ``accept-new``.
    """
    if node.known_hosts and node.known_hosts != USER_KNOWN_HOSTS:
        user_files = [node.known_hosts]
    else:
        user_files = str(cfg.get("userknownhostsfile", USER_KNOWN_HOSTS)).split()
    global_files = str(cfg.get("globalknownhostsfile", GLOBAL_KNOWN_HOSTS)).split()
    files = [os.path.expanduser(f) for f in (*user_files, *global_files)]
    accepted = None
    if node.host_key_policy == "accept-new":
        accepted = files[0] + ACCEPTED_SUFFIX
        files.append(accepted)
    alias = cfg.get("hostkeyalias")
    names = (str(alias),) if alias else tuple(host_names(host, port))
    return tuple(files), accepted, names


INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH


def _with_includes(path: str, base: str, depth: int) -> str:
    """The ssh config at ``path`` with its ``Include`` lines replaced by the files they name.

    As OpenSSH: relative paths are under ``base`` (``~/.ssh`` for the user's file),
    globs expand in sorted order, missing files are skipped; inside a Host/Match
    block the included text is conditional like the block's other lines.
    """
    if depth > INCLUDE_DEPTH:
        raise ValueError(f"ssh config {path}: Include nested deeper than {INCLUDE_DEPTH}")
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise ValueError(f"ssh config {path}: {exc.strerror}") from None
    out: list[str] = []
    for line in lines:
        words = line.strip().replace("=", " ", 1).split()
        if not words or words[0].lower() != "include":
            out.append(line)
            continue
        for pattern in words[1:]:
            full = os.path.expanduser(pattern)
            if not os.path.isabs(full):
                full = os.path.join(base, full)
            for found in sorted(glob.glob(full)):
                if os.path.isfile(found):
                    out.append(_with_includes(found, base, depth + 1))
    return "\n".join(out)


def _parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` → (user, host, port)."""
    user = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port = None
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif spec.count(":") == 1:
        host, p = spec.split(":")
        port = int(p)
    else:
        host = spec
    return user, host, port


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
        self._rate = RateLimiter(connect_rate)
        self._retries = connect_retries
        self._keepalive = keepalive
        self._config_arg = ssh_config
        self._config_path = os.path.expanduser(ssh_config or "~/.ssh/config")
        self._config: paramiko.SSHConfig | None = None
        self._known = KnownHostsCache()
        self._lock = threading.Lock()
        self._conns: dict[tuple[object, ...], paramiko.Transport] = {}
        self._key_locks: dict[tuple[object, ...], threading.Lock] = {}
        self._pkeys: dict[str, paramiko.PKey] = {}
        self._agent: list[paramiko.PKey] | None = None
        self._agent_lock = threading.Lock()
        self._endpoints: dict[tuple[object, ...], Endpoint] = {}
        self._running: set[paramiko.Channel] = set()
        self._cancelled = False
        self.connections_opened = 0  # for tests and benchmarks

    def process_factory(self, processes: int) -> Callable[[], SshTransport]:
        """A picklable maker of an equivalent transport for one of ``processes`` workers.

        Each worker gets its share of ``connect_rate``, so the cap stays global.
        """
        return functools.partial(
            SshTransport,
            connect_rate=self._rate.rate / max(1, processes),
            ssh_config=self._config_arg,
            connect_retries=self._retries,
            keepalive=self._keepalive,
        )

    # -- resolution ---------------------------------------------------------------

    def _ssh_config(self) -> paramiko.SSHConfig:
        with self._lock:
            if self._config is None:
                if os.path.isfile(self._config_path):
                    text = _with_includes(self._config_path, os.path.expanduser("~/.ssh"), 0)
                    self._config = paramiko.SSHConfig.from_text(text)
                else:
                    self._config = paramiko.SSHConfig()
            return self._config

    def endpoint(self, node: Node) -> Endpoint:
        """Where and how to connect for ``node`` (inventory + ssh config; cached).

        Raises:
            ValueError: a ProxyJump that cannot be parsed.
        """
        cache_key = (
            node.name,
            node.address,
            node.port,
            node.user,
            node.identity_file,
            node.known_hosts,
            node.host_key_policy,
            node.connect_timeout,
            node.proxy_jump,
        )
        hit = self._endpoints.get(cache_key)
        if hit is not None:
            return hit
        cfg = self._ssh_config().lookup(node.name)
        host = node.address if node.address != node.name else cfg.get("hostname", node.address)
        user = node.user if node.user != DEFAULT_USER else cfg.get("user", node.user)
        port = node.port if node.port != DEFAULT_PORT else int(cfg.get("port", node.port))
        identities = self._identities(node.identity_file, cfg)
        jump_spec = node.proxy_jump if node.proxy_jump else cfg.get("proxyjump")
        jump = None
        if jump_spec and jump_spec.lower() != "none":
            for hop in jump_spec.split(","):  # b1,b2: b1 first, b2 reached through it
                juser, jhost, jport = _parse_jump(hop.strip())
                jcfg = self._ssh_config().lookup(jhost)
                jhost_addr = jcfg.get("hostname", jhost)
                jport = jport or int(jcfg.get("port", DEFAULT_PORT))
                files, accepted, names = _trust(node, jcfg, jhost_addr, jport)
                jump = Endpoint(
                    label=f"jump host {jhost}",
                    host=jhost_addr,
                    port=jport,
                    user=juser or jcfg.get("user", user),
                    identities=self._identities(None, jcfg) if "identityfile" in jcfg else identities,
                    policy=node.host_key_policy,
                    connect_timeout=node.connect_timeout,
                    jump=jump,
                    agent=node.agent,
                    known_hosts=files,
                    accepted=accepted,
                    key_names=names,
                )
        files, accepted, names = _trust(node, cfg, host, port)
        proxy = cfg.get("proxycommand") if jump is None else None
        ep = Endpoint(
            label=node.name,
            host=host,
            port=port,
            user=user,
            identities=identities,
            policy=node.host_key_policy,
            connect_timeout=node.connect_timeout,
            jump=jump,
            agent=node.agent,
            known_hosts=files,
            accepted=accepted,
            key_names=names,
            proxy_command=str(proxy) if proxy else None,
        )
        self._endpoints[cache_key] = ep
        return ep

    @staticmethod
    def _identities(explicit: str | None, cfg: paramiko.SSHConfigDict) -> tuple[str, ...]:
        if explicit:
            return (os.path.expanduser(explicit),)
        from_cfg = cfg.get("identityfile")
        if from_cfg:
            return tuple(os.path.expanduser(p) for p in from_cfg)
        found = [os.path.expanduser(p) for p in DEFAULT_IDENTITIES]
        return tuple(p for p in found if os.path.exists(p))

    def preload(self, nodes: Sequence[Node]) -> None:
        """Parse every node's known_hosts now, so a malformed file fails before fan-out.

        Raises:
            KnownHostsError: a malformed line (an InputError: exit 2, names file:line).
        """
        for node in nodes:
            if node.connection == "ssh":
                try:
                    ep = self.endpoint(node)
                except ValueError:
                    continue  # that node's own result says why (one bad host spoils no other)
                self._known.load_all(ep.known_hosts)

    # -- connecting ---------------------------------------------------------------

    def _pkey(self, path: str) -> paramiko.PKey:
        with self._lock:
            hit = self._pkeys.get(path)
        if hit is not None:
            return hit
        try:
            key = paramiko.PKey.from_path(path)
            cert = path + "-cert.pub"  # OpenSSH's default CertificateFile for this key
            if os.path.isfile(cert):
                key.load_certificate(cert)
        except (paramiko.PasswordRequiredException, TypeError):
            # cryptography reports an encrypted OpenSSH-format key as a TypeError.
            raise _ConnectError(
                NodeState.AUTH, f"identity file {path} is passphrase-protected; brctl never prompts"
            ) from None
        except FileNotFoundError:
            raise _ConnectError(NodeState.AUTH, f"identity file {path} not found") from None
        except (OSError, paramiko.SSHException, ValueError) as exc:
            raise _ConnectError(NodeState.AUTH, f"identity file {path}: {exc}") from None
        with self._lock:
            self._pkeys[path] = key
        return key

    def _lock_for(self, key: tuple[object, ...]) -> threading.Lock:
        with self._lock:
            lock = self._key_locks.get(key)
            if lock is None:
                lock = self._key_locks[key] = threading.Lock()
            return lock

    def _connection(self, ep: Endpoint) -> tuple[paramiko.Transport, bool]:
        """The cached live connection to ``ep``, or a new one; (transport, is_new)."""
        with self._lock_for(ep.key):
            with self._lock:
                conn = self._conns.get(ep.key)
            if conn is not None and conn.is_active():
                return conn, False
            if conn is not None:
                self._drop(ep, conn)
            conn = self._connect(ep)
            with self._lock:
                self._conns[ep.key] = conn
            return conn, True

    def _drop(self, ep: Endpoint, conn: paramiko.Transport) -> None:
        with self._lock:
            if self._conns.get(ep.key) is conn:
                del self._conns[ep.key]
        conn.close()

    def _connect(self, ep: Endpoint) -> paramiko.Transport:
        """Open and authenticate, retrying connection-level failures within the budget."""
        self._rate.acquire()
        deadline = time.monotonic() + ep.connect_timeout
        attempt = 0
        while True:
            try:
                return self._connect_once(ep, deadline)
            except _ConnectError as exc:
                delay = min(RETRY_CAP_S, RETRY_BASE_S * 2**attempt) * random.uniform(0.5, 1.0)
                if not exc.retriable or attempt >= self._retries or time.monotonic() + delay >= deadline:
                    raise
            attempt += 1
            time.sleep(delay)
            self._rate.acquire()

    def _open_socket(
        self, ep: Endpoint, deadline: float
    ) -> socket.socket | _ChannelSocket | paramiko.ProxyCommand:
        where = f"{ep.host}:{ep.port}"
        if ep.proxy_command:
            try:
                return paramiko.ProxyCommand(ep.proxy_command)
            except (OSError, ValueError, paramiko.SSHException) as exc:
                raise _ConnectError(
                    NodeState.UNREACHABLE, f"ProxyCommand {ep.proxy_command!r} failed: {exc}"
                ) from None
        if ep.jump is not None:
            try:
                jump, _ = self._connection(ep.jump)
            except _ConnectError as exc:
                raise _ConnectError(
                    exc.state, f"{ep.jump.label}: {exc.message}", retriable=exc.retriable
                ) from None
            try:
                chan = jump.open_channel(
                    "direct-tcpip",
                    (ep.host, ep.port),
                    ("127.0.0.1", 0),
                    timeout=max(0.01, deadline - time.monotonic()),
                )
            except paramiko.ChannelException as exc:
                raise _ConnectError(
                    NodeState.UNREACHABLE,
                    f"{ep.jump.label} could not connect to {where}: {exc.text}",
                    retriable=True,
                ) from None
            except (paramiko.SSHException, EOFError, OSError) as exc:
                self._drop(ep.jump, jump)
                raise _ConnectError(
                    NodeState.UNREACHABLE, f"{ep.jump.label} connection lost: {exc}", retriable=True
                ) from None
            return _ChannelSocket(chan)
        try:
            infos = socket.getaddrinfo(ep.host, ep.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise _ConnectError(NodeState.UNREACHABLE, f"cannot resolve {ep.host}: {exc.strerror}") from None
        family, stype, proto, _, addr = infos[0]
        sock = socket.socket(family, stype, proto)
        # paramiko never sets it; without it every round trip waits for delayed ACKs.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The kernel notices a vanished peer on an idle cached connection, too, and
        # (with paramiko's keepalive packets) on a busy one within the interval.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if self._keepalive:
            k = self._keepalive
            for opt, value in (("TCP_KEEPIDLE", k), ("TCP_KEEPINTVL", max(1, k // 3)),
                               ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", k * 1000)):
                if hasattr(socket, opt):
                    sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            sock.connect(addr)
        except socket.timeout:
            sock.close()
            raise _ConnectError(
                NodeState.TIMEOUT, f"TCP connect to {where} timed out ({ep.connect_timeout:g}s)"
            ) from None
        except OSError as exc:
            sock.close()
            raise _ConnectError(
                NodeState.UNREACHABLE, f"{where}: {exc.strerror or exc}", retriable=True
            ) from None
        return sock

    def _connect_once(self, ep: Endpoint, deadline: float) -> paramiko.Transport:
        sock = self._open_socket(ep, deadline)
        transport = paramiko.Transport(sock)  # type: ignore[arg-type]
        try:
            self._handshake(transport, ep, deadline)
        except BaseException:
            transport.close()
            raise
        with self._lock:
            self.connections_opened += 1
        return transport

    def _handshake(self, t: paramiko.Transport, ep: Endpoint, deadline: float) -> None:
        where = f"{ep.host}:{ep.port}"
        left = max(0.01, deadline - time.monotonic())
        # Every phase is bounded by what is left of connect_timeout.
        t.banner_timeout = left
        t.handshake_timeout = left
        t.auth_timeout = left
        known = self._known.load_all(ep.known_hosts)
        self._prefer_known_key_types(t, known.keytypes_for(ep.host, ep.port, names=ep.key_names))
        try:
            t.start_client(timeout=left)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if time.monotonic() >= deadline - 0.05:
                raise _ConnectError(
                    NodeState.TIMEOUT,
                    f"{where}: no SSH banner/key exchange within connect_timeout ({ep.connect_timeout:g}s)",
                ) from None
            raise _ConnectError(
                NodeState.UNREACHABLE,
                f"{where}: connection lost during SSH handshake ({exc or type(exc).__name__})",
                retriable=True,
            ) from None
        done = getattr(t, "completion_event", None)
        if done is None or not done.is_set():  # start_client returns quietly on its timeout
            raise _ConnectError(
                NodeState.TIMEOUT,
                f"{where}: no SSH banner/key exchange within connect_timeout ({ep.connect_timeout:g}s)",
            )
        self._check_host_key(t, ep)
        self._authenticate(t, ep, deadline)
        if self._keepalive:
            t.set_keepalive(self._keepalive)
        if isinstance(t.sock, socket.socket):
            # paramiko's reader thread polls its socket every 0.1 s; an idle cached
            # connection (the daemon holds thousands) need not wake that often.
            # Data still wakes it at once, and close() does not wait for it.
            t.sock.settimeout(IDLE_POLL_S)

    @staticmethod
    def _prefer_known_key_types(t: paramiko.Transport, known_types: list[str]) -> None:
        """Ask for host key types known_hosts lists first, as OpenSSH does."""
        if not known_types:
            return
        wanted = set(known_types)
        if "ssh-rsa" in wanted:
            wanted.update(_RSA_ALGS)
        opts = t.get_security_options()
        current = list(opts.key_types)
        opts.key_types = [k for k in current if k in wanted] + [k for k in current if k not in wanted]

    def _check_host_key(self, t: paramiko.Transport, ep: Endpoint) -> None:
        key = t.get_remote_server_key()
        keytype, blob = key.get_name(), key.asbytes()
        name = ep.key_names[0]
        what = f"{keytype} {fingerprint(blob)}"
        known = self._known.load_all(ep.known_hosts)
        status = known.check(ep.host, ep.port, keytype, blob, names=ep.key_names)
        if status is HostKeyStatus.KNOWN:
            return
        authority = known.has_authority(ep.key_names) if status is HostKeyStatus.UNKNOWN else None
        if authority is not None:
            # Never trust on first use what the organisation publishes through a CA.
            msg = (f"host key for {name} is vouched for only by @cert-authority ({authority}), and "
                   "brctl cannot verify host certificates (paramiko #771/#2277); refusing. "
                   f"List the host's key ({what}) in a known_hosts file")
        elif status is HostKeyStatus.UNKNOWN and ep.accepted is not None:
            self._known.accept(ep.accepted, name, keytype, blob)
            return
        elif status is HostKeyStatus.REVOKED:
            msg = f"host key for {name} is @revoked ({what})"
        elif status is HostKeyStatus.CHANGED:
            msg = (
                f"host key for {name} CHANGED: server presented {what}, which does not match "
                f"{ep.known_hosts[0]}; refusing (possible man-in-the-middle)"
            )
        else:
            msg = (f"host key for {name} is unknown ({what}); not in {', '.join(ep.known_hosts)}; "
                   "add it or set host_key_policy: accept-new")
        raise _ConnectError(NodeState.HOSTKEY, msg)

    def _agent_keys(self) -> list[paramiko.PKey]:
        """The ssh-agent's keys (``$SSH_AUTH_SOCK``), asked once per transport; none without one."""
        with self._lock:
            if self._agent is None:
                self._agent = []
                if os.environ.get("SSH_AUTH_SOCK"):
                    with contextlib.suppress(OSError, paramiko.SSHException):  # no usable agent
                        self._agent = list(paramiko.Agent().get_keys())
            return list(self._agent)

    def _credentials(self, ep: Endpoint) -> tuple[list[paramiko.PKey], list[str]]:
        """The keys to offer, in order (files, then the agent's), and why files were skipped."""
        keys: list[paramiko.PKey] = []
        skipped: list[str] = []
        for path in ep.identities:
            try:
                keys.append(self._pkey(path))
            except _ConnectError as exc:
                skipped.append(exc.message)
        if ep.agent:
            keys.extend(self._agent_keys())
        return keys, skipped

    def _authenticate(self, t: paramiko.Transport, ep: Endpoint, deadline: float) -> None:
        where = f"{ep.user}@{ep.host}:{ep.port}"
        keys, skipped = self._credentials(ep)
        if not keys:
            why = "; ".join(skipped) or "no identity file configured or found"
            hint = " and no ssh-agent holds a key" if ep.agent else " (ssh.agent: false)"
            raise _ConnectError(NodeState.AUTH, f"{where}: {why}{hint}")
        for pkey in keys:
            try:
                if isinstance(pkey, paramiko.AgentKey):
                    with self._agent_lock:  # one agent socket: never two requests at once
                        t.auth_publickey(ep.user, pkey)
                else:
                    t.auth_publickey(ep.user, pkey)
            except paramiko.AuthenticationException:
                if time.monotonic() >= deadline - 0.05:
                    raise _ConnectError(
                        NodeState.TIMEOUT,
                        f"{where}: authentication did not finish within connect_timeout "
                        f"({ep.connect_timeout:g}s)",
                    ) from None
                continue
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise _ConnectError(
                    NodeState.UNREACHABLE, f"{where}: connection lost during auth ({exc})"
                ) from None
            if t.is_authenticated():
                return
        extra = f" ({'; '.join(skipped)})" if skipped else ""
        raise _ConnectError(NodeState.AUTH, f"{where}: public key refused{extra}")

    # -- running ------------------------------------------------------------------

    def _session(self, node: Node, t0: float) -> tuple[paramiko.Channel | None, RunResult | None]:
        """An open session channel on the node, or the result that says why not."""
        try:
            ep = self.endpoint(node)
        except ValueError as exc:
            return None, _result(node.name, NodeState.UNREACHABLE, t0, str(exc))
        for attempt in (0, 1):
            try:
                conn, new = self._connection(ep)
            except _ConnectError as exc:
                return None, _result(node.name, exc.state, t0, exc.message)
            except KnownHostsError as exc:
                return None, _result(node.name, NodeState.HOSTKEY, t0, exc.message)
            asked = time.monotonic()
            try:
                return conn.open_session(timeout=ep.connect_timeout), None
            except paramiko.ChannelException as exc:  # e.g. MaxSessions: the connection is fine
                return None, _result(node.name, NodeState.UNREACHABLE, t0, f"session refused: {exc}")
            except (paramiko.SSHException, EOFError, OSError) as exc:
                hung = conn.is_active() and time.monotonic() - asked >= ep.connect_timeout * 0.95
                self._drop(ep, conn)
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
        for chan in running:
            chan.close()

    def _track(self, chan: paramiko.Channel, add: bool) -> None:
        with self._lock:
            if add:
                self._running.add(chan)
            else:
                self._running.discard(chan)
        if add and self._cancelled:  # cancelled while this one was opening
            chan.close()

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
        cmd = command_line(wrapped(NODE_PYTHON, with_env(argv, node.env), timeout))
        try:
            return self._exec(node, chan, cmd, stdin, timeout, t0)
        finally:
            self._track(chan, False)
            chan.close()

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
        try:
            chan.settimeout(max(0.01, give_up - time.monotonic()))
            chan.exec_command(cmd)
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
            return RunResult(
                node.name, NodeState.TIMEOUT, None, out.text(),
                err.text() + f"brctl: no exit status {timeout:g}s+{GRACE_S + SLACK_S:g}s after start; "
                "gave up on the node\n",
                time.monotonic() - t0,
            )  # fmt: skip
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if not self._cancelled:  # else cancel() closed the channel under us
                return _result(node.name, NodeState.UNREACHABLE, t0, f"connection lost while running: {exc}")
        code = chan.exit_status
        seconds = time.monotonic() - t0
        if code == -1:  # no exit status: why did the channel end?
            if self._cancelled:
                state, why = NodeState.TIMEOUT, "interrupted; the command was killed"
            elif not _alive(chan):
                state, why = NodeState.UNREACHABLE, "connection lost while running"
            else:
                state, why = NodeState.FAILED, "the command ended without an exit status"
            return RunResult(node.name, state, None, out.text(), err.text() + f"brctl: {why}\n", seconds)
        state = exit_state(code, time.monotonic() - started, timeout)
        return RunResult(node.name, state, None if state is NodeState.TIMEOUT else code,
                         out.text(), err.text(), seconds)

    # -- files --------------------------------------------------------------------

    def stream(
        self, node: Node, argv: Sequence[str], *, timeout: float,
        stdin: BinaryIO | None = None, stdout: BinaryIO | None = None,
    ) -> RunResult:
        """Run ``argv`` with bulk stdin/stdout files (checkpoint shards): see ``Transport.stream``.

        Under the reaper like ``run``; the channel's own timeout is ``timeout`` too,
        so a stream that stops moving for that long is a ``timeout``. stderr is read
        at the end (probes write little there). A ``stdout`` that stops taking data
        (the other end of a relay died) closes the channel: the command gets SIGPIPE.
        """
        t0 = time.monotonic()
        chan, failed = self._session(node, t0)
        if chan is None:
            assert failed is not None
            return failed
        cmd = command_line(wrapped(NODE_PYTHON, with_env(argv, node.env), timeout))
        out = Capture(node.output_keep)
        try:
            chan.settimeout(timeout + GRACE_S + SLACK_S)
            chan.exec_command(cmd)
            if stdin is not None:
                threading.Thread(target=_pump, args=(stdin, chan), daemon=True,
                                 name=f"brctl-stream-{node.name}").start()
            else:
                chan.shutdown_write()
            while True:
                data = chan.recv(STDIN_SLICE)
                if not data:
                    break
                if stdout is None:
                    out.add(data)
                else:
                    stdout.write(data)
            if not chan.status_event.wait(SLACK_S + GRACE_S):
                raise socket.timeout()
            err = b""
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
        except (socket.timeout, TimeoutError):
            return _result(node.name, NodeState.TIMEOUT, t0, f"stream stalled or ran past {timeout:g}s")
        except BrokenPipeError:
            return _result(node.name, NodeState.FAILED, t0, "the receiving end of the stream went away", 1)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            return _result(node.name, NodeState.UNREACHABLE, t0, f"connection lost while streaming: {exc}")
        finally:
            chan.close()
        code = chan.exit_status
        if code == -1:
            return _result(node.name, NodeState.UNREACHABLE, t0, "connection lost while streaming")
        return RunResult(node.name, exit_state(code, time.monotonic() - t0, timeout), code,
                         out.text(), err.decode(errors="replace"), time.monotonic() - t0)

    def put(self, node: Node, local_path: str, remote_path: str, *, timeout: float) -> RunResult:
        """Copy a local file to the node over SFTP: written as a temp name, then renamed.

        SFTP follows symlinks in ``remote_path``: only for paths no untrusted user can
        write (checkpoint shards use ``stream`` and a node-side receiver instead).
        """
        return self._sftp(node, local_path, remote_path, timeout, upload=True)

    def get(self, node: Node, remote_path: str, local_path: str, *, timeout: float) -> RunResult:
        """Copy a file from the node over SFTP to a local temp name, then rename it."""
        return self._sftp(node, remote_path, local_path, timeout, upload=False)

    def _sftp(self, node: Node, src: str, dst: str, timeout: float, *, upload: bool) -> RunResult:
        t0 = time.monotonic()
        chan, failed = self._session(node, t0)
        if chan is None:
            assert failed is not None
            return failed
        tmp = f"{dst}.brctl-tmp-{uuid.uuid4().hex[:12]}"
        try:
            chan.settimeout(timeout)
            chan.invoke_subsystem("sftp")
            sftp = paramiko.SFTPClient(chan)
            try:
                if upload:
                    sftp.put(src, tmp)
                    sftp.posix_rename(tmp, dst)
                else:
                    sftp.get(src, tmp)
                    os.replace(tmp, dst)
            except BaseException:
                self._cleanup(sftp, tmp, upload)
                raise
            finally:
                sftp.close()
        except (socket.timeout, TimeoutError):
            return _result(node.name, NodeState.TIMEOUT, t0, f"copy timed out after {timeout:g}s")
        except (OSError, paramiko.SSHException, EOFError) as exc:
            where = f"{node.name}:{src}" if not upload else src
            return _result(node.name, NodeState.FAILED, t0, f"copy of {where} failed: {exc}", 1)
        finally:
            chan.close()
        return RunResult(node.name, NodeState.OK, 0, "", "", time.monotonic() - t0)

    @staticmethod
    def _cleanup(sftp: paramiko.SFTPClient, tmp: str, upload: bool) -> None:
        try:
            if upload:
                sftp.remove(tmp)
            else:
                os.unlink(tmp)
        except (OSError, paramiko.SSHException, EOFError):
            pass

    def close(self) -> None:
        """Close every connection (targets first, then jump hosts)."""
        with self._lock:
            conns = sorted(self._conns.items(), key=lambda kv: kv[0][3] is None)
            self._conns.clear()
        for _, conn in conns:
            conn.close()
