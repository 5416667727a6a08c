"""ssh config paramiko cannot evaluate, over real sshd and the real ``ssh -G`` (issue 14 item 7).

``Match exec`` hosts are resolved by ``ssh -G`` (one process per such host, none
for the others); a setting brctl cannot honour is exit 2 naming the host and the
setting, for that host only; user certificates (``CertificateFile``) log in.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

from brctl.core.transport import Node, NodeState
from brctl.remote.ssh import openssh as ssh_openssh
from brctl.remote.ssh.transport import SshTransport
from tests.integration.test_ssh_trust import _ssh_g
from tests.kits.cluster import SshCluster, scaled

pytestmark = pytest.mark.integration


def _spy_ssh_g(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Record every process the resolver starts (the real ``subprocess.run`` still runs them)."""
    calls: list[list[str]] = []
    real = subprocess.run

    def run(argv: list[str], **kw: Any) -> Any:
        calls.append(list(argv))
        return real(argv, **kw)

    monkeypatch.setattr(ssh_openssh.subprocess, "run", run)
    return calls


def _node(name: str) -> Node:
    return Node(name=name, address=name, known_hosts="~/.ssh/known_hosts", connect_timeout=scaled(10))


def test_match_exec_hosts_are_resolved_by_ssh_g_and_only_they(
    ssh_cluster: SshCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    flag, log = tmp_path / "use-node02", tmp_path / "exec.log"
    script = tmp_path / "pick.sh"
    script.write_text(f'#!/bin/sh\necho "$1" >> {log}\ntest -e {flag}\n')
    script.chmod(0o755)
    cfg = tmp_path / "config"
    cfg.write_text(
        f'Match originalhost gpu* exec "{script} %n"\n  HostName {ssh_cluster.address("node02")}\n'
        f"Host gpu* plain*\n  HostName {ssh_cluster.address('node01')}\n  Port {ssh_cluster.port}\n"
        f"  User root\n  IdentityFile {ssh_cluster.client_key}\n"
        f"  UserKnownHostsFile {ssh_cluster.known_hosts}\n"
    )
    flag.touch()
    want = _ssh_g(cfg, "gpu01")  # before the spy: it patches subprocess.run itself
    flag.unlink()
    log.unlink()
    calls = _spy_ssh_g(monkeypatch)
    t = SshTransport(ssh_config=str(cfg))
    try:
        plain = [t.endpoint(_node(f"plain{i:02d}")) for i in range(20)]
        assert {ep.host for ep in plain} == {ssh_cluster.address("node01")}
        assert calls == [] and not log.exists()  # a plain host spawns nothing, runs no exec

        flag.touch()
        ep = t.endpoint(_node("gpu01"))
        assert len(calls) == 1 and calls[0][-1] == "gpu01" and "-G" in calls[0]
        assert ep.host == want["hostname"][0] == ssh_cluster.address("node02")
        assert str(ep.port) == want["port"][0] and ep.user == want["user"][0]
        assert ep.identities == (str(ssh_cluster.client_key),)
        assert ep.known_hosts[0] == want["userknownhostsfile"][0].split()[0]
        r = t.run(_node("gpu01"), ["sh", "-c", "echo $SSH_CONNECTION"], timeout=scaled(10))
        assert r.state is NodeState.OK, r
        assert r.stdout.split()[2] == ssh_cluster.address("node02")  # where the exec sent it
        assert len(calls) == 1  # resolved once, then cached
        r = t.run(_node("plain01"), ["sh", "-c", "echo $SSH_CONNECTION"], timeout=scaled(10))
        assert r.stdout.split()[2] == ssh_cluster.address("node01"), r
    finally:
        t.close()
    assert log.read_text().split() == ["gpu01"]  # ssh -G ran the exec once; paramiko never did

    flag.unlink()
    t = SshTransport(ssh_config=str(cfg))
    try:
        assert t.endpoint(_node("gpu02")).host == ssh_cluster.address("node01")
    finally:
        t.close()


def test_unsupported_setting_is_exit_2_for_that_host_only(
    ssh_cluster: SshCluster, tmp_path: Path, brctl: Callable[..., Any],
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        "Host node02\n  IdentityAgent /run/elsewhere/agent.sock\n"
        "Match originalhost node03 nosuchcriterion x\n  User nobody\n"
        "Host node04\n  ProxyJump bastion:notaport\n"
    )
    inv = ssh_cluster.write_inventory(tmp_path)
    env = {"HOME": str(home)}
    res = brctl("-i", inv, "exec", "-w", "node01", "true", env=env)
    assert res.exit_code == 0, res.stderr  # the other hosts' settings are never judged

    for name, setting in (("node02", "IdentityAgent /run/elsewhere/agent.sock"),
                          ("node03", "nosuchcriterion"), ("node04", "bastion:notaport")):
        res = brctl("-i", inv, "exec", "-w", name, "true", env=env)
        assert res.exit_code == 2, (name, res)
        assert f"host {name}" in res.stderr and setting in res.stderr, res.stderr
        assert "Traceback" not in res.stderr

    res = brctl("-i", inv, "--json", "exec", "true", env=env)
    assert res.exit_code == 2
    doc = res.json
    assert doc["schema"] == "brctl.error/1"
    assert all(f"host {n}" in doc["message"] for n in ("node02", "node03", "node04"))
    assert "host node01" not in doc["message"]


def test_user_certificate_from_certificate_file_logs_in(
    make_cluster: Callable[..., SshCluster], tmp_path: Path,
) -> None:
    """sshd trusts only a user CA: the key alone is refused, key + CertificateFile logs in."""
    cluster = make_cluster(1)
    ca, key = tmp_path / "user_ca", tmp_path / "id_user"
    for path in (ca, key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    certs = tmp_path / "certs"
    certs.mkdir()
    (tmp_path / "id_user.pub").rename(certs / "id_user.pub")  # not beside the key: no -cert.pub default
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "brctl-test", "-n", "root",
                    str(certs / "id_user.pub")], check=True)
    sshd_config = cluster.node_dir("node01") / "sshd_config"
    sshd_config.write_text(sshd_config.read_text().replace(
        f"AuthorizedKeysFile {cluster.root / 'authorized_keys'}",
        f"AuthorizedKeysFile none\nTrustedUserCAKeys {ca}.pub"))
    cluster.stop_node("node01")
    cluster.start_node("node01")

    addr, port = cluster.address("node01"), cluster.port
    base = f"Host node01\n  HostName {addr}\n  Port {port}\n  IdentityFile {key}\n" \
           f"  UserKnownHostsFile {cluster.known_hosts}\n"
    for with_cert, state in ((False, NodeState.AUTH), (True, NodeState.OK)):
        cfg = tmp_path / f"config-{with_cert}"
        cfg.write_text(base + (f"  CertificateFile {certs / 'id_user-cert.pub'}\n" if with_cert else ""))
        t = SshTransport(ssh_config=str(cfg))
        try:
            r = t.run(_node("node01"), ["id", "-u"], timeout=scaled(10))
        finally:
            t.close()
        assert r.state is state, (with_cert, r)
    assert r.stdout.strip() == "0"
    assert "brctl-test" in cluster.log("node01")  # the certificate's key id: it was the cert



class _FreezingProxy:
    """A loopback TCP relay to ``target`` that, once ``freeze`` is set, forwards nothing more.

    The sockets stay open and the kernel still acknowledges every byte, as when a
    jump host or ProxyCommand stays up but the machine behind it loses power: TCP
    keepalives and TCP_USER_TIMEOUT see nothing wrong.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        import socket
        import threading

        self.target = target
        self.freeze = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.held += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: Any, dst: Any) -> None:
        src.settimeout(0.1)
        while not self.freeze.is_set():
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            dst.sendall(data)

    def close(self) -> None:
        self.listener.close()
        for s in self.held:
            s.close()


def test_a_silent_loss_behind_a_relay_is_caught_by_keepalives(
    ssh_cluster: SshCluster, tmp_path: Path,
) -> None:
    """Keepalives that want a reply: 3 unanswered ones (ServerAliveCountMax) close the connection."""
    import threading
    import time

    proxy = _FreezingProxy((ssh_cluster.address("node01"), ssh_cluster.port))
    cfg = tmp_path / "config"
    cfg.write_text(f"Host relayed\n  HostName 127.0.0.1\n  Port {proxy.port}\n  User root\n"
                   f"  HostKeyAlias [{ssh_cluster.address('node01')}]:{ssh_cluster.port}\n"
                   f"  IdentityFile {ssh_cluster.client_key}\n  UserKnownHostsFile {ssh_cluster.known_hosts}\n")
    t = SshTransport(ssh_config=str(cfg), keepalive=1)
    node = _node("relayed")
    try:
        assert t.run(node, ["true"], timeout=scaled(10)).state is NodeState.OK
        threading.Timer(1.0, proxy.freeze.set).start()
        t0 = time.monotonic()
        r = t.run(node, ["sleep", "20"], timeout=scaled(25))
        took = time.monotonic() - t0
    finally:
        t.close()
        proxy.close()
    assert r.state is NodeState.UNREACHABLE and "connection lost" in r.stderr, r
    assert took < 1 + scaled(8), took  # freeze + ~(3 + 1) keepalive intervals, not the command's 20 s
