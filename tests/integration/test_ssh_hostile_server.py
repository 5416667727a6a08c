"""SshTransport against a hostile ssh server: real paramiko on both ends, over loopback.

A compromised node runs whatever sshd it likes. These servers answer the handshake,
auth and (unless said) keepalives correctly and then misbehave in ways real sshd never does, so
each misbehaviour is exact and repeatable; brctl must still bound every run.
"""

from __future__ import annotations

import io
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest

from brctl.core.transport import Node, NodeState
from brctl.remote.ssh.transport import SshTransport
from brctl.remote.wrap import GRACE_S, SLACK_S

# the give-up timer closes channels from its own thread: nothing may escape it as a traceback
pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")]


class _Server(paramiko.ServerInterface):
    """Accepts any key for root and any session; ``on_exec`` decides what an exec does."""

    def __init__(self, on_exec: Callable[[paramiko.Channel], bool]) -> None:
        self.on_exec = on_exec

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        return self.on_exec(channel)


def _drop_exec(chan: paramiko.Channel, m: paramiko.Message) -> None:
    """A channel request handler that never answers an exec request (all else as paramiko)."""
    at = m.packet.tell()
    if m.get_text() == "exec":
        return
    m.packet.seek(at)
    paramiko.Channel._handle_request(chan, m)


Hostile = Callable[..., Node]


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[Hostile]:
    """``hostile(on_exec, drop_exec=False)`` starts a server on loopback and returns a Node
    that trusts it; ``drop_exec``: exec requests are never answered."""
    stop = threading.Event()
    listeners: list[socket.socket] = []
    transports: list[paramiko.Transport] = []

    def start(on_exec: Callable[[paramiko.Channel], bool], drop_exec: bool = False) -> Node:
        key = paramiko.ECDSAKey.generate()
        client = paramiko.ECDSAKey.generate()
        client_file = tmp_path / "id"
        client.write_private_key_file(str(client_file))
        os.chmod(client_file, 0o600)
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)
        port = listener.getsockname()[1]
        known = tmp_path / "known_hosts"
        known.write_text(f"[127.0.0.1]:{port} {key.get_name()} {key.get_base64()}\n")

        def serve() -> None:
            while not stop.is_set():
                try:
                    sock, _ = listener.accept()
                except OSError:
                    return
                t = paramiko.Transport(sock)
                if drop_exec:
                    t._channel_handler_table = {**t._channel_handler_table,
                                                paramiko.common.MSG_CHANNEL_REQUEST: _drop_exec}
                t.add_server_key(key)
                transports.append(t)
                t.start_server(server=_Server(on_exec))

        threading.Thread(target=serve, daemon=True).start()
        return Node(name="evil", address="127.0.0.1", port=port, identity_file=str(client_file),
                    known_hosts=str(known), connect_timeout=5.0, agent=False)

    try:
        yield start
    finally:
        stop.set()
        for listener in listeners:
            listener.close()
        for t in transports:
            t.close()


@pytest.mark.parametrize("how", ["run", "stream"])
def test_an_exec_request_never_answered_costs_the_command_timeout_not_forever(
    hostile: Hostile, how: str,
) -> None:
    # paramiko's exec_command waits for the answer without a limit; this node never gives it,
    # yet answers keepalives: the connection looks healthy for ever.
    node = hostile(lambda chan: True, drop_exec=True)
    transport = SshTransport(ssh_config=os.devnull)
    box: dict[str, object] = {}

    def go() -> None:
        if how == "run":
            box["result"] = transport.run(node, ["true"], timeout=0.5)
        else:
            box["result"] = transport.stream(node, ["true"], timeout=0.5, stdout=io.BytesIO())
        box["at"] = time.monotonic()

    t0 = time.monotonic()
    runner = threading.Thread(target=go, daemon=True)
    runner.start()
    runner.join(0.5 + GRACE_S + SLACK_S + 5)
    try:
        assert not runner.is_alive(), "run() still waiting for the exec answer"
        r = box["result"]
        assert r.state is NodeState.TIMEOUT, r  # type: ignore[attr-defined]
        assert float(box["at"]) - t0 <= 0.5 + GRACE_S + SLACK_S + 2  # type: ignore[arg-type]
    finally:
        transport.close()
