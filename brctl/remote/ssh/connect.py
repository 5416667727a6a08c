"""Opening authenticated paramiko connections for ``SshTransport``: sockets, routes, trust, keys.

Connections. One authenticated paramiko transport per (user, host, port, jump)
is opened on first use and reused by every later command until ``close()``; a
caller that finds a cached one dead drops it (``drop``) and asks again. Sockets
are opened here with ``TCP_NODELAY`` (without it every request/response turn
waits ~40 ms on Nagle/delayed ACK: 45 ms → 3 ms per command) and keepalives are
on. New connections are capped at ``connect_rate`` per second (a token bucket,
separate from the fan-out's concurrency) and connection-level failures (refused,
reset, lost during the handshake) are retried with capped, jittered exponential
back-off inside the connect budget; auth and host-key refusals are not retried.
``connect_timeout`` bounds TCP connect + banner + key exchange + auth (retries
included). A silent loss (power) is seen through keepalives: every ``keepalive``
seconds of silence a request that wants a reply is sent, and 3 unanswered in a
row close the connection (OpenSSH's ServerAliveCountMax: this also holds through
a jump host or ProxyCommand); on a direct socket TCP_USER_TIMEOUT also drops a
connection whose packets go unacknowledged that long.

States (``ConnectError``). Refused/reset/lost/no route → ``unreachable``; the
connect budget spent (TCP, or a listener that never sends a banner) →
``timeout``; the node refused our key → ``auth``; unknown, changed or revoked
host key → ``hostkey``. Each message is one short line.

Host keys (``brctl.remote.ssh.known_hosts``; which files: ``brctl.remote.ssh.config``),
as OpenSSH, parsed once and indexed. ``strict`` (the default)
refuses unknown keys; ``accept-new`` trusts a host never seen before and appends
its key to ``<known_hosts>.brctl-accepted`` (the user's own file is never
written; that file is trusted only under ``accept-new``) — a changed or
``@revoked`` key is refused in both modes, and so is a host vouched for only by
``@cert-authority`` (paramiko cannot verify host certificates), never trusted on
first use.

Credentials, no prompts ever. The endpoint's identity files, each first with
every ssh config ``CertificateFile`` issued for it, then with its
``<key>-cert.pub`` user certificate when there is one (else bare); then the ssh-agent's keys
(``$SSH_AUTH_SOCK``; ``ssh.agent: false`` turns that off). No agent forwarding,
no passwords or keyboard-interactive; a passphrase-protected key no agent holds
is ``auth`` with a message saying so, never a prompt. Key material never appears
in messages.

Jump hosts: one authenticated connection to the jump host, every target opened as
a ``direct-tcpip`` channel over it, at full fan-out. The jump host's host key is
checked like any other. paramiko has a race there: ``Channel.send`` checks
``closed`` under its lock but sends outside it, so a target's close racing its
transport's last packet puts a data packet after our CHANNEL_CLOSE, and OpenSSH
then drops the *whole* jump connection ("data packet referred to nonexistent
channel"). ``_ChannelSocket`` serialises send and close. The channel request is
bounded by the target's ``connect_timeout`` like a session request (``Watch``): no
answer in time is ``timeout``, and the jump connection is closed only when found
unable to send (a frozen jump host whose socket is full); one that can send stays,
since other targets' commands run over it (a jump host answers only once its own
connect to the target ends: for one that drops SYNs, minutes). Closing a target's
connection never waits for a send stuck in a jump connection: that connection,
found unable to send, is closed (``_ChannelSocket.close``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shlex
import socket
import threading
import time
from typing import Any

from brctl.core.locks import KeyedLocks
from brctl.core.transport import NodeState
from brctl.remote.ssh.config import Endpoint
from brctl.remote.ssh.known_hosts import HostKeyStatus, KnownHostsCache, fingerprint
from brctl.remote.ssh.liveness import Watch, cannot_send, close_stuck, keepalive_with_replies
from brctl.remote.ssh.paramiko_lite import paramiko

# paramiko logs transport errors at ERROR; with no handler configured Python's
# last-resort handler would print them on brctl's stderr. Results carry the message.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

KEEPALIVE_S = 15  # detect dead peers on cached connections between daemon polls
IDLE_POLL_S = 1.0  # reader-thread wake-up interval on an established connection
RETRY_BASE_S = 0.1
RETRY_CAP_S = 2.0
_RSA_ALGS = ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")
# AES-GCM first (OpenSSH offers it by default too): an AEAD cipher needs no separate
# HMAC per packet, and paramiko checks HMACs byte by byte in Python (util.
# constant_time_bytes_eq), the costliest part of its packet handling on a short command.
_AEAD_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


class ConnectError(Exception):
    """Why a connection could not be made: the node's state and a one-line message."""

    def __init__(self, state: NodeState, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.state = state
        self.message = message
        self.retriable = retriable


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
        """Close the channel, no data after our CHANNEL_CLOSE; never waiting for ever on a send.

        A send holds the lock while the jump connection takes its bytes: at most the
        channel's timeout (0.1 s, paramiko's) while it can send. One stuck there (a frozen
        jump host whose socket other commands filled) would hold this close, and whoever
        waits on it (a ``Watch``, a reader thread, ``Connector.close``), until the kernel
        drops the jump connection, or for ever behind another jump host: the jump
        connection, found unable to send, is closed (every target's connection over it
        is stuck as well), which ends the send. One that can send is never closed.
        """
        outer = self._chan.get_transport()
        while not self._lock.acquire(timeout=0.1):
            if outer is not None and cannot_send(outer):
                close_stuck(outer)
        try:
            self._closed = True
            self._chan.close()
        finally:
            self._lock.release()

    def getpeername(self) -> str:
        return self._chan.getpeername()


def proxy_process(command: str) -> paramiko.ProxyCommand:
    """ProxyCommand ``command`` (its %-tokens expanded) started as ssh starts it,
    ``$SHELL -c "exec COMMAND"`` (/bin/sh without ``$SHELL``): its shell expands ``~``
    and ``$VAR`` and reads its quotes and a ``#`` comment (paramiko alone splits it into
    words and runs them)."""
    shell = os.environ.get("SHELL") or "/bin/sh"
    return paramiko.ProxyCommand(shlex.join([shell, "-c", f"exec {command}"]))  # split back by paramiko


class Connector:
    """Opens, caches and closes authenticated connections; thread-safe.

    Args:
        connect_rate: new connections per second, at most (all nodes together).
        connect_retries: extra attempts after a connection-level failure.
        keepalive: seconds between keepalives on open connections (0: off).
    """

    def __init__(self, *, connect_rate: float, connect_retries: int, keepalive: int) -> None:
        self._rate = RateLimiter(connect_rate)
        self._retries = connect_retries
        self._keepalive = keepalive
        self.known = KnownHostsCache()
        self._lock = threading.Lock()
        self._conns: dict[tuple[object, ...], paramiko.Transport] = {}
        self._lock_for = KeyedLocks()  # one attempt per connection or identity file at a time
        self._pkeys: dict[tuple[str, str | None], paramiko.PKey] = {}
        self._failed: dict[tuple[object, ...], tuple[Endpoint, ConnectError]] = {}  # the last failure per key
        self._agent: list[paramiko.PKey] | None = None
        self._agent_lock = threading.Lock()
        self.connections_opened = 0  # for tests and benchmarks

    def pkey(self, path: str, certificate: str | None = None) -> paramiko.PKey:
        """The key at ``path`` (cached), bearing ``certificate``, or else its ``-cert.pub`` if any.

        Raises:
            ConnectError: ``auth``, saying why the key cannot be used; a ValueError
                when ``certificate`` is not a certificate of this key.
        """
        # Loaded once, not once per fan-out thread: cryptography checks an RSA key as it
        # loads it (50-400 ms, the GIL held), and every thread reaches auth at once.
        with self._lock_for(("identity file", path, certificate)):
            return self._load_pkey(path, certificate)

    def _load_pkey(self, path: str, certificate: str | None) -> paramiko.PKey:
        with self._lock:
            hit = self._pkeys.get((path, certificate))
        if hit is not None:
            return hit
        try:
            key = paramiko.PKey.from_path(path)
        except (paramiko.PasswordRequiredException, TypeError):
            # cryptography reports an encrypted OpenSSH-format key as a TypeError.
            raise ConnectError(
                NodeState.AUTH, f"identity file {path} is passphrase-protected; brctl never prompts"
            ) from None
        except FileNotFoundError:
            raise ConnectError(NodeState.AUTH, f"identity file {path} not found") from None
        except (OSError, paramiko.SSHException, ValueError) as exc:
            raise ConnectError(NodeState.AUTH, f"identity file {path}: {exc}") from None
        default_cert = path + "-cert.pub"  # OpenSSH's default certificate for this key
        try:
            if certificate is not None:
                key.load_certificate(certificate)  # ValueError: not this key's certificate
            elif os.path.isfile(default_cert):
                key.load_certificate(default_cert)
        except (OSError, paramiko.SSHException) as exc:
            raise ConnectError(NodeState.AUTH, f"certificate for {path}: {exc}") from None
        with self._lock:
            self._pkeys[(path, certificate)] = key
        return key

    def _certified(self, path: str, certificates: tuple[str, ...]) -> list[paramiko.PKey]:
        """The key at ``path`` once per ssh config ``CertificateFile`` issued for it (as ssh pairs them)."""
        out = []
        for cert in certificates:
            if cert == path + "-cert.pub" or not os.path.isfile(cert):
                continue  # already borne by the plain key / skipped, as ssh does
            with contextlib.suppress(ValueError, ConnectError):
                out.append(self.pkey(path, cert))
        return out

    def connection(self, ep: Endpoint) -> tuple[paramiko.Transport, bool]:
        """The cached live connection to ``ep``, or a new one; (transport, is_new).

        Threads that want the same connection (every node behind one jump host) wait for
        one attempt; when it fails, they all get its answer instead of each trying again
        for its own ``connect_timeout`` (64 nodes behind a hung bastion took 64 of them).
        """
        with self._lock:
            failed_before = self._failed.get(ep.key)
        with self._lock_for(ep.key):
            with self._lock:
                conn = self._conns.get(ep.key)
                failed = self._failed.get(ep.key)
            if conn is not None and conn.is_active():
                return conn, False
            # It failed while we waited, tried as we would try it (a jump host's Endpoint
            # takes connect_timeout, identities and policy from the node behind it).
            if failed is not None and failed is not failed_before and failed[0] == ep:
                raise ConnectError(failed[1].state, failed[1].message, retriable=failed[1].retriable)
            if conn is not None:
                self.drop(ep, conn)
            try:
                conn = self._connect(ep)
            except ConnectError as exc:
                with self._lock:
                    # a new tuple per failure (told apart by identity), without its traceback
                    self._failed[ep.key] = (ep, ConnectError(exc.state, exc.message, retriable=exc.retriable))
                raise
            with self._lock:
                self._conns[ep.key] = conn
            return conn, True

    def drop(self, ep: Endpoint, conn: paramiko.Transport) -> None:
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
            except ConnectError as exc:
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
                return proxy_process(ep.proxy_command)
            except (OSError, ValueError, paramiko.SSHException) as exc:
                raise ConnectError(
                    NodeState.UNREACHABLE, f"ProxyCommand {ep.proxy_command!r} failed: {exc}"
                ) from None
        if ep.jump is not None:
            return self._open_channel(ep, ep.jump, deadline)
        try:
            infos = socket.getaddrinfo(ep.host, ep.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ConnectError(NodeState.UNREACHABLE, f"cannot resolve {ep.host}: {exc.strerror}") from None
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
            raise ConnectError(
                NodeState.TIMEOUT, f"TCP connect to {where} timed out ({ep.connect_timeout:g}s)"
            ) from None
        except OSError as exc:
            sock.close()
            raise ConnectError(
                NodeState.UNREACHABLE, f"{where}: {exc.strerror or exc}", retriable=True
            ) from None
        return sock

    def _open_channel(self, ep: Endpoint, jep: Endpoint, deadline: float) -> _ChannelSocket:
        """A ``direct-tcpip`` channel to ``ep`` over the connection to its jump host ``jep``."""
        where = f"{ep.host}:{ep.port}"
        try:
            jump, _ = self.connection(jep)
        except ConnectError as exc:
            raise ConnectError(
                exc.state, f"{jep.label}: {exc.message}", retriable=exc.retriable
            ) from None
        # The request may not even go out (a frozen jump host whose socket other
        # commands filled): see Watch.
        try:
            with Watch(jump, deadline):
                chan = jump.open_channel(
                    "direct-tcpip",
                    (ep.host, ep.port),
                    ("127.0.0.1", 0),
                    timeout=max(0.01, deadline - time.monotonic()),
                )
        except paramiko.ChannelException as exc:
            raise ConnectError(
                NodeState.UNREACHABLE,
                f"{jep.label} could not connect to {where}: {exc.text}",
                retriable=True,
            ) from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if not jump.is_active():
                self.drop(jep, jump)
            if time.monotonic() >= deadline - 0.05:  # paramiko's timeout, or the watch's close
                # No answer in time: a hung jump host (closed by the watch if it could not
                # even send), or one still connecting to a target that drops its SYNs. A
                # jump connection that can send stays: other targets' commands run over it.
                raise ConnectError(
                    NodeState.TIMEOUT,
                    f"{jep.label}: no answer to connecting to {where} within "
                    f"connect_timeout ({ep.connect_timeout:g}s)",
                ) from None
            raise ConnectError(
                NodeState.UNREACHABLE, f"{jep.label} connection lost: {exc}", retriable=True
            ) from None
        return _ChannelSocket(chan)

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
        known = self.known.load_all(ep.known_hosts)
        self._prefer_known_key_types(t, known.keytypes_for(ep.host, ep.port, names=ep.key_names))
        self._prefer_aead(t)
        try:
            t.start_client(timeout=left)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if time.monotonic() >= deadline - 0.05:
                raise ConnectError(
                    NodeState.TIMEOUT,
                    f"{where}: no SSH banner/key exchange within connect_timeout ({ep.connect_timeout:g}s)",
                ) from None
            raise ConnectError(
                NodeState.UNREACHABLE,
                f"{where}: connection lost during SSH handshake ({exc or type(exc).__name__})",
                retriable=True,
            ) from None
        done = getattr(t, "completion_event", None)
        if done is None or not done.is_set():  # start_client returns quietly on its timeout
            raise ConnectError(
                NodeState.TIMEOUT,
                f"{where}: no SSH banner/key exchange within connect_timeout ({ep.connect_timeout:g}s)",
            )
        self._check_host_key(t, ep)
        self._authenticate(t, ep, deadline)
        if self._keepalive:
            keepalive_with_replies(t, self._keepalive)
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

    @staticmethod
    def _prefer_aead(t: paramiko.Transport) -> None:
        opts = t.get_security_options()
        current = list(opts.ciphers)
        opts.ciphers = [c for c in _AEAD_FIRST if c in current] + [c for c in current if c not in _AEAD_FIRST]

    def _check_host_key(self, t: paramiko.Transport, ep: Endpoint) -> None:
        key = t.get_remote_server_key()
        keytype, blob = key.get_name(), key.asbytes()
        name = ep.key_names[0]
        what = f"{keytype} {fingerprint(blob)}"
        known = self.known.load_all(ep.known_hosts)
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
            if self.known.accept(ep.accepted, name, keytype, blob):
                return
            msg = (f"host key for {name} CHANGED while connecting: server presented {what}, but "
                   f"another key was just accepted for it in {ep.accepted}; refusing")
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
        raise ConnectError(NodeState.HOSTKEY, msg)

    def _agent_keys(self) -> list[paramiko.PKey]:
        """The ssh-agent's keys (``$SSH_AUTH_SOCK``), asked once per transport; none without one.

        The agent is one socket: its requests go one at a time (``_agent_lock``), the
        signatures as well, but only they: the rest of each authentication (its round
        trips to the node) runs side by side."""
        with self._agent_lock:  # not the connector's lock: a slow agent holds up only auth
            if self._agent is None:
                self._agent = []
                if os.environ.get("SSH_AUTH_SOCK"):
                    with contextlib.suppress(OSError, paramiko.SSHException):  # no usable agent
                        self._agent = [self._one_request_at_a_time(k) for k in paramiko.Agent().get_keys()]
            return list(self._agent)

    def _one_request_at_a_time(self, key: paramiko.AgentKey) -> paramiko.AgentKey:
        sign = key.sign_ssh_data

        def signed(*args: Any, **kwargs: Any) -> Any:
            with self._agent_lock:
                return sign(*args, **kwargs)

        setattr(key, "sign_ssh_data", signed)  # noqa: B010 - on this key only, not the class
        return key

    def _credentials(self, ep: Endpoint) -> tuple[list[paramiko.PKey], list[str]]:
        """The keys to offer, in order (files, then the agent's), and why files were skipped."""
        keys: list[paramiko.PKey] = []
        skipped: list[str] = []
        for path in ep.identities:
            try:
                plain = self.pkey(path)
            except ConnectError as exc:
                skipped.append(exc.message)
                continue
            keys.extend(self._certified(path, ep.certificates))  # certificates first, as ssh offers them
            keys.append(plain)
        if ep.agent:
            keys.extend(self._agent_keys())
        return keys, skipped

    def _authenticate(self, t: paramiko.Transport, ep: Endpoint, deadline: float) -> None:
        where = f"{ep.user}@{ep.host}:{ep.port}"
        keys, skipped = self._credentials(ep)
        if not keys:
            why = "; ".join(skipped) or "no identity file configured or found"
            hint = " and no ssh-agent holds a key" if ep.agent else " (ssh.agent: false)"
            raise ConnectError(NodeState.AUTH, f"{where}: {why}{hint}")
        for pkey in keys:
            try:
                t.auth_publickey(ep.user, pkey)  # an agent's key signs under _agent_lock
            except paramiko.AuthenticationException:
                if time.monotonic() >= deadline - 0.05:
                    raise ConnectError(
                        NodeState.TIMEOUT,
                        f"{where}: authentication did not finish within connect_timeout "
                        f"({ep.connect_timeout:g}s)",
                    ) from None
                continue
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise ConnectError(
                    NodeState.UNREACHABLE, f"{where}: connection lost during auth ({exc})"
                ) from None
            if t.is_authenticated():
                return
        extra = f" ({'; '.join(skipped)})" if skipped else ""
        raise ConnectError(NodeState.AUTH, f"{where}: public key refused{extra}")

    def close(self) -> None:
        """Close every connection (targets first, then jump hosts)."""
        with self._lock:
            conns = sorted(self._conns.items(), key=lambda kv: kv[0][3] is None)
            self._conns.clear()
        for _, conn in conns:
            conn.close()
