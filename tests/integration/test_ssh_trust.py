"""Host trust and routes as OpenSSH has them, over real sshd (issue 14 items 6 and 7)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from brctl.core.transport import NodeState
from brctl.remote.fanout import run_all
from brctl.remote.ssh.config import ACCEPTED_SUFFIX
from brctl.remote.ssh.transport import SshTransport
from tests.integration.test_ssh_transport import nodes_of
from tests.kits.cluster import SshCluster, scaled

pytestmark = pytest.mark.integration


def _host_line(cluster: SshCluster, name: str) -> str:
    """The cluster's known_hosts line of ``name``: ``[addr]:port keytype key``."""
    prefix = f"[{cluster.address(name)}]:{cluster.port} "
    return next(ln for ln in cluster.known_hosts.read_text().splitlines() if ln.startswith(prefix))


def _hashed(name: str) -> str:
    salt = b"brctl-test-salt-0001"
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def test_hashed_revoked_key_is_refused(ssh_cluster: SshCluster, tmp_path: Path) -> None:
    line = _host_line(ssh_cluster, "node01")
    name, key = line.split(" ", 1)
    kh = tmp_path / "known_hosts"
    kh.write_text(f"{line}\n@revoked {_hashed(name)} {key}\n")
    t = SshTransport(ssh_config=str(tmp_path / "none"))
    try:
        r = t.run(nodes_of(ssh_cluster, ["node01"], known_hosts=str(kh))[0], ["true"], timeout=scaled(10))
    finally:
        t.close()
    assert r.state is NodeState.HOSTKEY and "@revoked" in r.stderr, r


def test_host_ca_only_is_refused_never_trusted_on_first_use(ssh_cluster: SshCluster, tmp_path: Path) -> None:
    ca = tmp_path / "host_ca"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ca)], check=True)
    host_key = ssh_cluster.node_dir("node02") / "ssh_host_ed25519_key.pub"
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "node02", "-h",
                    "-n", ssh_cluster.address("node02"), "-O", "no-touch-required",
                    str(host_key)], check=False, capture_output=True)
    kh = tmp_path / "known_hosts"
    kh.write_text(f"@cert-authority [127.0.0.*]:* {ca.with_suffix('.pub').read_text().strip()}\n")
    node = nodes_of(ssh_cluster, ["node02"], known_hosts=str(kh), host_key_policy="accept-new")[0]
    t = SshTransport(ssh_config=str(tmp_path / "none"))
    try:
        r = t.run(node, ["true"], timeout=scaled(10))
    finally:
        t.close()
    assert r.state is NodeState.HOSTKEY, r
    assert "@cert-authority" in r.stderr and "cannot verify host certificates" in r.stderr
    assert not Path(str(kh) + ACCEPTED_SUFFIX).exists()  # nothing trusted on first use


def test_global_and_configured_known_hosts_and_alias(ssh_cluster: SshCluster, tmp_path: Path) -> None:
    """The key only in a GlobalKnownHostsFile, under a HostKeyAlias; the user file empty."""
    _, key = _host_line(ssh_cluster, "node03").split(" ", 1)
    (tmp_path / "global").write_text(f"fleet-node03 {key}\n")
    (tmp_path / "user").write_text("")
    cfg = tmp_path / "config"
    cfg.write_text(f"Host node03\n  UserKnownHostsFile {tmp_path / 'user'}\n"
                   f"  GlobalKnownHostsFile {tmp_path / 'global'}\n  HostKeyAlias fleet-node03\n")
    node = nodes_of(ssh_cluster, ["node03"], known_hosts="~/.ssh/known_hosts")[0]
    t = SshTransport(ssh_config=str(cfg))
    try:
        assert t.run(node, ["true"], timeout=scaled(10)).state is NodeState.OK
    finally:
        t.close()
    other = replace(node, name="node03b")  # no alias: the global file does not list it
    t = SshTransport(ssh_config=str(cfg))
    try:
        assert t.run(other, ["true"], timeout=scaled(10)).state is NodeState.HOSTKEY
    finally:
        t.close()


def test_two_hop_proxy_jump(ssh_cluster: SshCluster, tmp_path: Path) -> None:
    hops = ",".join(f"root@{ssh_cluster.address(n)}:{ssh_cluster.port}" for n in ("node01", "node02"))
    node = nodes_of(ssh_cluster, ["node04"], proxy_jump=hops)[0]
    before = {n: ssh_cluster.count_connections(n) for n in ("node01", "node02", "node04")}
    t = SshTransport(ssh_config=str(tmp_path / "none"))
    try:
        r = t.run(node, ["sh", "-c", "echo $SSH_CONNECTION"], timeout=scaled(10))
    finally:
        t.close()
    assert r.state is NodeState.OK, r
    assert r.stdout.split()[2] == ssh_cluster.address("node04")
    after = {n: ssh_cluster.count_connections(n) for n in before}
    assert all(after[n] == before[n] + 1 for n in before), (before, after)


def test_first_jump_host_is_reached_by_its_own_proxy_command(ssh_cluster: SshCluster, tmp_path: Path) -> None:
    """``ProxyJump b1,b2`` where b1 has its own ProxyCommand: ssh goes node02 → b1 → b2 → target."""
    c, key, kh = ssh_cluster, ssh_cluster.client_key, ssh_cluster.known_hosts
    cfg = tmp_path / "config"
    cfg.write_text(
        f"Host b1\n  HostName {c.address('node01')}\n"
        f"  ProxyCommand ssh -F none -i {key} -o BatchMode=yes -o UserKnownHostsFile={kh} "
        f"-p {c.port} -W %h:%p root@{c.address('node02')}\n"
        f"Host b2\n  HostName {c.address('node03')}\n"
        f"Host target\n  HostName {c.address('node04')}\n  ProxyJump b1,b2\n"
        f"Host *\n  Port {c.port}\n  User root\n  IdentityFile {key}\n  UserKnownHostsFile {kh}\n")
    from brctl.core.transport import Node

    before = {n: c.count_connections(n) for n in ("node01", "node02", "node03", "node04")}
    t = SshTransport(ssh_config=str(cfg))
    try:
        r = t.run(Node(name="target", address="target", known_hosts="~/.ssh/known_hosts",
                       connect_timeout=scaled(10)), ["sh", "-c", "echo $SSH_CONNECTION"], timeout=scaled(10))
    finally:
        t.close()
    assert r.state is NodeState.OK, r
    assert r.stdout.split()[2] == c.address("node04")
    after = {n: c.count_connections(n) for n in before}
    assert all(after[n] == before[n] + 1 for n in before), (before, after)  # node02: b1's ProxyCommand


def _ssh_g(cfg: Path, host: str) -> dict[str, list[str]]:
    out = subprocess.run(["ssh", "-F", str(cfg), "-G", host], capture_output=True, text=True,
                         check=True).stdout
    got: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        got.setdefault(key, []).append(value)
    return got


def test_include_match_and_proxy_command_as_ssh_sees_them(ssh_cluster: SshCluster, tmp_path: Path) -> None:
    """Settings resolved as ``ssh -G`` resolves them; the ProxyCommand route really used."""
    from brctl.core.transport import Node

    kh = ssh_cluster.known_hosts
    key = ssh_cluster.client_key
    via = ssh_cluster.address("node01")
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "10-fleet.conf").write_text(
        f"Host fleet4\n  HostName {ssh_cluster.address('node04')}\n  Port {ssh_cluster.port}\n"
        f"  ProxyCommand ssh -F none -i {key} -o BatchMode=yes -o UserKnownHostsFile={kh} "
        f"-p {ssh_cluster.port} -W %h:%p root@{via}\n"
        "Match originalhost fleet*\n  User root\n"
        f"  IdentityFile {key}\n  UserKnownHostsFile {kh}\n"
    )
    cfg = tmp_path / "config"
    cfg.write_text(f"Include {tmp_path}/conf.d/*.conf\nHost *\n  User nobody-else\n")
    want = _ssh_g(cfg, "fleet4")
    ep = SshTransport(ssh_config=str(cfg)).endpoint(Node(name="fleet4", address="fleet4",
                                                         known_hosts="~/.ssh/known_hosts"))
    assert ep.host == want["hostname"][0] and str(ep.port) == want["port"][0]
    assert ep.user == want["user"][0] == "root"
    assert ep.identities == (str(key),) and want["identityfile"] == [str(key)]
    assert ep.known_hosts[0] == want["userknownhostsfile"][0] == str(kh)
    assert ep.proxy_command == want["proxycommand"][0].replace(
        "%h:%p", f"{ssh_cluster.address('node04')}:{ssh_cluster.port}")
    before = ssh_cluster.count_connections("node01")
    t = SshTransport(ssh_config=str(cfg))
    try:
        r = t.run(Node(name="fleet4", address="fleet4", known_hosts="~/.ssh/known_hosts",
                       connect_timeout=scaled(10)), ["sh", "-c", "echo $SSH_CONNECTION"], timeout=scaled(10))
    finally:
        t.close()
    assert r.state is NodeState.OK, r
    assert r.stdout.split()[2] == ssh_cluster.address("node04")
    assert ssh_cluster.count_connections("node01") == before + 1  # really through the proxy


def test_agent_keys_are_used_and_a_locked_key_says_why(
    ssh_cluster: SshCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os
    import time

    locked = tmp_path / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "s3cret", "-f", str(locked)], check=True)
    with open(ssh_cluster.root / "authorized_keys", "a") as fh:
        fh.write(locked.with_suffix(".pub").read_text())
    node = nodes_of(ssh_cluster, ["node01"], identity_file=str(locked))[0]
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    t = SshTransport(ssh_config=str(tmp_path / "none"))
    try:
        r = t.run(node, ["true"], timeout=scaled(10))
    finally:
        t.close()
    assert r.state is NodeState.AUTH and "passphrase-protected" in r.stderr and "ssh-agent" in r.stderr, r
    assert "s3cret" not in r.stderr
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + scaled(10)
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        plain = tmp_path / "id_plain"
        plain.write_bytes(locked.read_bytes())
        os.chmod(plain, 0o600)
        subprocess.run(["ssh-keygen", "-q", "-p", "-P", "s3cret", "-N", "", "-f", str(plain)], check=True)
        subprocess.run(["ssh-add", "-q", str(plain)], check=True, env={**os.environ, "SSH_AUTH_SOCK": str(sock)},
                       capture_output=True)
        plain.unlink()
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        for agent_on, state in ((True, NodeState.OK), (False, NodeState.AUTH)):
            t = SshTransport(ssh_config=str(tmp_path / "none"))
            try:
                r = t.run(replace(node, agent=agent_on), ["true"], timeout=scaled(10))
            finally:
                t.close()
            assert r.state is state, (agent_on, r)
        # A fan-out: the agent's one socket signs for every node, one request at a time,
        # while the rest of each authentication runs side by side.
        t = SshTransport(ssh_config=str(tmp_path / "none"))
        try:
            every = nodes_of(ssh_cluster, identity_file=str(locked))
            results = run_all(t, every, ["true"], timeout=scaled(10))
        finally:
            t.close()
        assert {r.state for r in results.values()} == {NodeState.OK}, results
        assert len(results) == len(ssh_cluster.names) > 1
    finally:
        agent.terminate()
        agent.wait()
