"""Connections that cannot send, and peers that stopped answering: how brctl tells
and bounds them (``brctl.remote.ssh.connect``, ``brctl.remote.ssh``).

paramiko sends block while the connection's socket takes nothing (a frozen node
whose socket other commands' stdin filled, a frozen jump host) until the kernel
drops it (TCP_USER_TIMEOUT; behind a jump host never). ``cannot_send`` tells such a
connection (a key exchange or a packet write not done in ``STUCK_S``), ``close_stuck``
ends it and every send blocked on it, ``Watch`` bounds a block's waits by a
deadline, and ``keepalive_with_replies`` are OpenSSH's ServerAliveInterval/CountMax,
sent without ever waiting behind a stuck write. These read paramiko internals (its
write lock, handler table and ``_send_message``); without them paramiko's own
reply-less keepalive is used and a connection is never taken for stuck.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from brctl.remote.ssh.paramiko_lite import paramiko

STUCK_S = 0.5  # a key exchange or packet write not done in this long, once overdue, holds a connection stuck
KEEPALIVE_COUNT_MAX = 3  # unanswered keepalives before the connection is closed (ServerAliveCountMax)


def _write_lock(t: paramiko.Transport) -> Any:
    """paramiko's packet write lock (private; None without it): every send holds it while its
    bytes go out, so a socket that takes nothing (a frozen node) keeps it held."""
    return getattr(getattr(t, "packetizer", None), "_Packetizer__write_lock", None)


def cannot_send(t: paramiko.Transport) -> bool:
    """Whether ``t``, still open, has been unable to send for ``STUCK_S``: a key exchange not
    done, or a packet's write still under way (checked by waiting that long for its lock)."""
    if not t.is_active():
        return False  # its blocked sends are ending already
    lock = _write_lock(t)
    if not t.clear_to_send.wait(STUCK_S) or lock is None or not lock.acquire(timeout=STUCK_S):
        return True
    lock.release()
    return False


def close_stuck(t: paramiko.Transport) -> None:
    """Close ``t``, and wake at once every thread blocked sending on it (each then raises
    EOFError): closing alone leaves a thread waiting to write its socket's poll timeout.
    Quietly: it runs on a timer's or the reader's thread (a traceback on stderr)."""
    if isinstance(t.sock, socket.socket):
        with contextlib.suppress(OSError):
            t.sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
        t.close()


class Watch:
    """Bounds what the block it guards waits on ``conn`` to ``at``, sends included.

    paramiko's sends (session and exec requests, EOF, the window adjustments reads
    send) block while the connection cannot send, e.g. on a frozen node whose
    socket other commands' stdin filled, until the kernel drops it (TCP_USER_TIMEOUT,
    ~15 s; behind a jump host never). From ``at`` on, while the block still runs:
    ``then`` is called, if set (closing a channel ends a wait for the node's
    answer), and the connection is closed once it is found unable to send
    (``cannot_send``), so every send blocked on it returns; on a frozen node its other
    commands end with it. A connection that can send is never closed for a command
    that merely ran long. A target's connection behind a jump host found unable to
    send because its write is stuck in the jump connection: that one is closed too,
    once found unable to send itself (``_ChannelSocket.close``).
    """

    def __init__(self, conn: paramiko.Transport, at: float) -> None:
        self.then: Callable[[], None] | None = None
        self.fired = False  # ``at`` passed with the block still running
        self._conn = conn
        self._done = threading.Event()
        self._timer = threading.Timer(max(0.0, at - time.monotonic()), self._fire)
        self._timer.daemon = True
        with contextlib.suppress(RuntimeError):  # no thread to be had: unwatched, as before
            self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        then = self.then
        if then is not None:
            then()
        while not self._done.wait(STUCK_S):
            if cannot_send(self._conn):
                close_stuck(self._conn)
                return

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._timer.cancel()


def keepalive_with_replies(t: paramiko.Transport, interval: int, count_max: int = KEEPALIVE_COUNT_MAX,
                            ) -> None:
    """Keepalives as OpenSSH's ServerAliveInterval/CountMax: each wants a reply; ``count_max``
    unanswered in a row close the connection.

    paramiko's own (``set_keepalive``) asks for no reply, so through a jump host or
    ProxyCommand, or past a relay that still acknowledges TCP, a peer that lost
    power is never noticed and a running command waits for its whole timeout.
    The keepalive is sent from paramiko's reader thread after ``interval``
    seconds without writing; a reply (success or failure: any answer shows the
    peer is there) resets the count. It never waits to be sent: a packet's write
    still under way then has been stuck ``interval`` seconds (the socket takes
    nothing: a frozen node), and waiting behind it would hold the reader thread,
    and the count, until the kernel drops the connection (TCP_USER_TIMEOUT, never
    behind a jump host); it counts as unanswered.
    """
    missed = [0]
    private: Any = t  # paramiko has no public hook for replies to global requests
    table = getattr(private, "_handler_table", None)  # per transport: wrapping touches no other
    replies = (paramiko.common.MSG_REQUEST_SUCCESS, paramiko.common.MSG_REQUEST_FAILURE)
    write_lock = _write_lock(t)
    if (not isinstance(table, dict) or not all(p in table for p in replies) or write_lock is None
            or not callable(getattr(private, "_send_message", None))):
        t.set_keepalive(interval)  # a paramiko without those internals: its own, reply-less kind
        return
    for ptype in replies:
        def answered(m: paramiko.Message, original: Any = table[ptype]) -> None:
            missed[0] = 0
            original(m)
        table[ptype] = answered
    ref = weakref.ref(private)

    def probe() -> None:
        conn: Any = ref()
        if conn is None:
            return
        if missed[0] >= count_max:
            close_stuck(conn)  # the reader thread closing its own transport: no join, channels see it closed
            return
        missed[0] += 1
        m = paramiko.Message()
        m.add_byte(paramiko.common.cMSG_GLOBAL_REQUEST)
        m.add_string("keepalive@openssh.com")
        m.add_boolean(True)  # want_reply: the whole point
        # _send_user_message without its waits: its locks in its order, neither waited for.
        if not conn.clear_to_send_lock.acquire(blocking=False):
            return
        try:
            if conn.clear_to_send.is_set() and write_lock.acquire(blocking=False):
                try:
                    conn._send_message(m)
                finally:
                    write_lock.release()
        finally:
            conn.clear_to_send_lock.release()

    t.packetizer.set_keepalive(interval, probe)
