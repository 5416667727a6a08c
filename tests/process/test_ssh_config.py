"""ssh config resolution without a network: what paramiko may evaluate, what goes to ``ssh -G``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from brctl.core.errors import InputError
from brctl.core.transport import Node
from brctl.remote.ssh import openssh as ssh_openssh
from brctl.remote.ssh.config import EndpointResolver
from brctl.remote.ssh.openssh import NEVER_MATCHES, SshConfigError, defer_matches, unsupported


def _node(name: str, **kw: Any) -> Node:
    return Node(name=name, address=name, known_hosts="~/.ssh/known_hosts", **kw)


def test_match_lines_paramiko_cannot_evaluate_are_deferred() -> None:
    text = ("Host a\n  User x\n"
            "Match host gpu*,!gpu9 exec \"test -e /f\"\n  User y\n"
            "Match originalhost db* user root\n  Port 2\n"
            "Match canonical final\n  Port 3\n"
            "Match !host login* localnetwork 10.0.0.0/8\n  Port 4\n")
    kept, deferred = defer_matches(text, "cfg")
    assert kept.splitlines() == ["Host a", "  User x", NEVER_MATCHES, "  User y",
                                 "Match originalhost db* user root", "  Port 2",
                                 NEVER_MATCHES, "  Port 3", NEVER_MATCHES, "  Port 4"]
    gpu, canonical, local = deferred
    assert gpu.may_apply("gpu1", "gpu1") and not gpu.may_apply("gpu9", "gpu9")
    assert not gpu.may_apply("db1", "db1.example")
    assert gpu.may_apply("alias", "gpu3")  # `host` is the HostName: either may match
    assert canonical.may_apply("anything", "anything")  # no host criterion: every host
    assert local.may_apply("gpu1", "gpu1") and not local.may_apply("login1", "login1")


def test_a_match_line_that_cannot_be_split_names_it() -> None:
    with pytest.raises(SshConfigError, match="cfg: cannot read 'Match exec \"unclosed'"):
        defer_matches('Match exec "unclosed\n', "cfg")


@pytest.mark.parametrize(("cfg", "bad"), [
    ({"identityagent": "/run/a.sock"}, "IdentityAgent /run/a.sock"),
    ({"identityagent": "none"}, None),
    ({"identityagent": "SSH_AUTH_SOCK"}, None),
    ({"identityagent": "$SSH_AUTH_SOCK"}, None),  # ssh's legacy form: the same agent
    ({"bindaddress": "10.0.0.1"}, "BindAddress 10.0.0.1"),
    ({"knownhostscommand": "/bin/fetch %H"}, "KnownHostsCommand /bin/fetch %H"),
    ({"proxyusefdpass": "no", "securitykeyprovider": "internal"}, None),
])
def test_unsupported_names_the_setting(cfg: dict[str, str], bad: str | None) -> None:
    assert unsupported(cfg) == bad


def test_plain_config_spawns_nothing_and_bad_hosts_fail_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_process(*a: Any, **kw: Any) -> Any:
        raise AssertionError("a plain config must not start ssh -G")

    monkeypatch.setattr(ssh_openssh.subprocess, "run", no_process)
    cfg = tmp_path / "config"
    cfg.write_text("Host quiet\n  IdentityAgent none\nHost odd\n  BindAddress 10.1.1.1\n"
                   "Host hop\n  ProxyJump root@b1:22,b2:x\nMatch host never* exec \"false\"\n  Port 9\n")
    resolver = EndpointResolver(str(cfg))
    assert resolver.endpoint(_node("quiet")).agent is False
    assert resolver.endpoint(_node("other")).agent is True
    assert [resolver.endpoint(_node(f"n{i}")).port for i in range(100)] == [22] * 100
    with pytest.raises(SshConfigError, match=r"host odd: ssh config setting 'BindAddress 10\.1\.1\.1'") as exc:
        resolver.endpoint(_node("odd"))
    assert isinstance(exc.value, InputError)  # exit 2
    with pytest.raises(SshConfigError, match=r"host hop: ssh config ProxyJump 'root@b1:22,b2:x'.*'b2:x'"):
        resolver.endpoint(_node("hop"))


def test_the_ssh_transport_loads_without_invoke() -> None:
    """paramiko imports ``invoke`` (~0.2 s) only for Match exec, which brctl leaves to ssh -G."""
    import subprocess
    import sys

    code = ("import sys, brctl.remote.ssh.transport, paramiko.config as c\n"
            "assert 'invoke' not in sys.modules and c.invoke is None\n"
            "import invoke\n"  # anything else that wants it still gets it
            "print(invoke.__name__)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "invoke", done.stderr


def test_ssh_g_values_have_their_tokens_expanded(tmp_path: Path) -> None:
    """``ssh -G`` (the real one) prints ProxyCommand and IdentityFile tokens as written."""
    (tmp_path / "tok1_key").write_text("")
    cfg = tmp_path / "config"
    cfg.write_text("Match originalhost tok* exec true\n  HostName 10.9.8.7\n  Port 2200\n  User bob\n"
                   f"  ProxyCommand nc %h %p %r %n %%\n  IdentityFile {tmp_path}/%n_key\n"
                   "Match originalhost odd* exec true\n  ProxyCommand nc %Z\n")
    resolver = EndpointResolver(str(cfg))
    ep = resolver.endpoint(_node("tok1"))
    assert ep.proxy_command == "nc 10.9.8.7 2200 bob tok1 %"
    assert ep.identities == (str(tmp_path / "tok1_key"),)
    assert (ep.host, ep.port, ep.user) == ("10.9.8.7", 2200, "bob")
    with pytest.raises(SshConfigError, match=r"host odd1: .*token %Z"):
        resolver.endpoint(_node("odd1"))


def test_match_exec_hosts_are_resolved_concurrently(tmp_path: Path) -> None:
    """Each exec waits until another host's exec has started: only concurrent ssh -G runs all match."""

    from brctl.remote.ssh.transport import SshTransport

    seen = tmp_path / "seen"
    seen.mkdir()
    wait_s = 10 * float(os.environ.get("BRCTL_TIMEOUT_SCALE", "1") or 1)
    script = tmp_path / "barrier.sh"
    script.write_text(f'#!/bin/sh\ntouch {seen}/"$1"\ni=0\n'
                      f'while [ "$(ls {seen} | wc -l)" -lt 2 ] && [ $i -lt {int(wait_s * 10)} ]; do\n'
                      '  sleep 0.1; i=$((i+1))\ndone\n'
                      f'[ "$(ls {seen} | wc -l)" -ge 2 ]\n')
    script.chmod(0o755)
    cfg = tmp_path / "config"
    cfg.write_text(f'Match originalhost ex* exec "{script} %n"\n  HostName 10.0.0.9\n')
    t = SshTransport(ssh_config=str(cfg))
    nodes = [_node(f"ex{i}", connect_timeout=2 * wait_s) for i in range(4)]
    t.check_config(nodes)
    assert [t.endpoint(n).host for n in nodes] == ["10.0.0.9"] * 4


@pytest.mark.parametrize("guard, spawns", [
    ("Match host target", True), ("Match user alice", True), ("Match !host x", True),
    ("Match originalhost target", False), ("Host target", False), ("Match localuser root", False),
])
def test_only_a_guard_on_what_an_included_file_may_set_is_left_to_ssh_g(
        tmp_path: Path, guard: str, spawns: bool) -> None:
    """OpenSSH evaluates a Match once; paramiko sees it again after the included file
    (whose HostName or User may have changed what it tests): only then ``ssh -G``, and
    only for hosts it may concern."""
    inc = tmp_path / "inc.conf"
    inc.write_text("HostName moved.example\nHost *\n  Port 4100\n")
    cfg = tmp_path / "config"
    cfg.write_text(f"{guard}\n  Include {inc}\n  User after\n")
    assert EndpointResolver(str(cfg)).spawns() is spawns


def test_a_deferred_block_that_sets_nothing_brctl_reads_spawns_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fedora's system file wraps its crypto policy in ``Match final all``: no ``ssh -G`` per host for it."""
    policy = tmp_path / "openssh.config"
    policy.write_text("Ciphers aes256-gcm@openssh.com\nKexAlgorithms curve25519-sha256\n")
    cfg = tmp_path / "config"
    cfg.write_text(f"Match final all\n  Include {policy}\n  GSSAPIAuthentication yes\n  SendEnv LANG\n"
                   "Match exec true\n  ForwardX11 no\n")
    monkeypatch.setattr(ssh_openssh.subprocess, "run", lambda *a, **kw: pytest.fail("ssh -G started"))
    resolver = EndpointResolver(str(cfg))
    assert not resolver.spawns()
    assert resolver.endpoint(_node("n1")).port == 22
    kept, deferred = defer_matches("Match final\n  Ciphers x\nMatch exec true\n  User y\n", "cfg")
    assert [d.line for d in deferred] == ["Match exec true"]
    assert kept.splitlines()[0] == NEVER_MATCHES  # neutralised all the same: paramiko never runs it


def test_paramiko_keeps_the_certificate_lines_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_Config`` collects CertificateFile through keywords paramiko gives back as written; a
    paramiko that stops doing so is caught here, and brctl falls back to paramiko's reading
    (the first CertificateFile only) instead of losing them all or failing."""
    assert ssh_openssh.lines_kept_apart()
    cfg = tmp_path / "config"
    cfg.write_text("Host t1\n  CertificateFile /c/a\n  CertificateFile /c/b\nHost *\n  CertificateFile /c/c\n")
    assert EndpointResolver(str(cfg)).endpoint(_node("t1")).certificates == ("/c/a", "/c/b", "/c/c")
    monkeypatch.setattr(ssh_openssh, "lines_kept_apart", lambda: False)
    assert EndpointResolver(str(cfg)).endpoint(_node("t1")).certificates == ("/c/a",)
