"""brctl's ssh config resolution compared with the real ``ssh -G`` (issue 14 item 7).

Each case writes a config, resolves hosts through ``EndpointResolver`` (paramiko,
no process) and asks OpenSSH's own ``ssh -G`` the same question; where the two
differ brctl would contact a host differently from ``ssh``.
"""

from __future__ import annotations

import getpass
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from brctl.core.errors import ExitCode
from brctl.core.transport import Node
from brctl.remote.ssh import openssh as ssh_openssh
from brctl.remote.ssh.config import DEFAULT_USER, Endpoint, EndpointResolver
from brctl.remote.ssh.connect import proxy_process
from brctl.remote.ssh.openssh import SshConfigError

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")


def _node(name: str, user: str = DEFAULT_USER, **kw: Any) -> Node:
    return Node(name=name, address=name, user=user, known_hosts="~/.ssh/known_hosts", **kw)


def ssh_g(cfg: Path, host: str, *args: str) -> dict[str, list[str]]:
    """What OpenSSH resolves for ``host`` (``args``: extra options such as ``-l USER``)."""
    out = subprocess.run(["ssh", "-G", "-F", str(cfg), *args, "--", host], capture_output=True,
                         text=True, check=True, stdin=subprocess.DEVNULL).stdout
    got: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        got.setdefault(key, []).append(value)
    return got


def _want_user(got: dict[str, list[str]], explicit: str | None) -> str:
    """ssh's user; its default (the local login) is brctl's default, root, unless given."""
    user = got["user"][0]
    return DEFAULT_USER if explicit is None and user == getpass.getuser() else user


def assert_as_ssh(resolver: EndpointResolver, cfg: Path, name: str, user: str | None = None) -> None:
    """brctl's host, port and user for ``name`` are ``ssh -G``'s (``-l user`` when the inventory sets one)."""
    ep = resolver.endpoint(_node(name, user or DEFAULT_USER))
    got = ssh_g(cfg, name, *(["-l", user] if user else []))
    assert (ep.host, ep.port, ep.user) == (got["hostname"][0], int(got["port"][0]), _want_user(got, user)), \
        (name, user)


# -- Include: the included text is scoped to the block that includes it -------------------------

INCLUDES = {
    # An Include inside a Host block that does not match contributes nothing, and the
    # block's own later lines stay in that block.
    "inside a non-matching block": (
        "Host other\n  Include {d}/star.conf\n  User x\nHost target\n  HostName t.example\n"),
    # ... even the included file's own Host lines (OpenSSH reads it "never matching").
    "own Host lines under a non-matching block": (
        "Host other\n  Include {d}/hosts.conf\n  User x\n"),
    # Inside a matching block: the file applies, its Host lines decide for the rest of
    # it, and after it the enclosing block resumes.
    "inside a matching block": (
        "Host target\n  Include {d}/hosts.conf\n  HostName after.example\n  User y\n"),
    # At the top: lines after the Include apply to every host again.
    "at the top, then global lines": (
        "Include {d}/hosts.conf\nPort 4444\nUser z\nHost target\n  HostName late.example\n"),
    # A glob: each file starts in the enclosing state, not the previous file's last block.
    "a glob of files": (
        "Host target other\n  Include {d}/g/*.conf\n  User w\n"),
    # Nested: the inner file is conditional on both enclosing blocks.
    "nested": (
        "Host target\n  Include {d}/outer.conf\nHost *\n  User nested\n"),
    "inside a Match": (
        "Match originalhost tar*\n  Include {d}/star.conf\n  User m\nHost third\n  Port 2300\n"),
    # A guard on what the included file itself sets (HostName, User) is evaluated once,
    # where the Include is: the file's later blocks and the block's own later lines
    # still apply once the name or the user it tested has changed.
    "a Match host guard whose file sets HostName": (
        "Match host target\n  Include {d}/sets-hostname.conf\n  User after\n"),
    "a Match user guard whose file sets User": (
        "Match user {me}\n  Include {d}/sets-user.conf\n  Port 4300\n"),
    "a negated Match host guard": (
        "Match !host moved.example\n  Include {d}/sets-hostname.conf\n  User after\n"),
    # ... and so is the included file's first line, once a line of the block before it
    # (or an earlier Include of it) has changed what the guard tests.
    "a Match host guard whose block set HostName before the Include": (
        "Match host target\n  HostName moved.example\n  Include {d}/user-only.conf\n"),
    "a Match host guard over two Includes, the first setting HostName": (
        "Match host target\n  Include {d}/hostname-only.conf\n  Include {d}/user-only.conf\n"),
    "a Match user guard whose block set User before the Include": (
        "Match user {me}\n  User bob\n  Include {d}/port-only.conf\n"),
}


@pytest.mark.parametrize("case", sorted(INCLUDES))
@pytest.mark.parametrize("name", ["target", "other", "third"])
def test_include_placements_resolve_as_ssh_g(tmp_path: Path, case: str, name: str) -> None:
    d = tmp_path
    (d / "star.conf").write_text("Host *\n  Port 2222\n")
    (d / "comma-host.conf").write_text("Host target,other\n  Port 2131\n")
    (d / "hosts.conf").write_text("Port 3333\nHost target\n  User fromfile\nHost other\n  Port 3334\n")
    (d / "g").mkdir()
    (d / "g" / "1.conf").write_text("Host other\n  Port 5001\n")
    (d / "g" / "2.conf").write_text("Port 5002\nHostName g2.example\n")
    (d / "outer.conf").write_text(f"Host other target\n  Include {d}/inner.conf\nHost target\n  Port 6001\n"
                                  )
    (d / "inner.conf").write_text("Host *\n  HostName inner.example\n  User inner\n")
    (d / "sets-hostname.conf").write_text("HostName moved.example\nHost *\n  Port 4100\n")
    (d / "sets-user.conf").write_text("User bob\nHost *\n  Port 4200\n")
    (d / "hostname-only.conf").write_text("HostName moved.example\n")
    (d / "user-only.conf").write_text("User fu\n")
    (d / "port-only.conf").write_text("Port 4500\n")
    cfg = d / "config"
    cfg.write_text(INCLUDES[case].format(d=d, me=getpass.getuser()))
    assert_as_ssh(EndpointResolver(str(cfg)), cfg, name)


# -- Match user sees the user brctl logs in as -----------------------------------------------

MATCHES = {
    "user": "Match user alice\n  Port 2200\n",
    "negated user": "Match !user alice\n  Port 2201\n",
    "originalhost and user": "Match originalhost tar* user alice,bob\n  Port 2202\n",
    "host after HostName": "Host target\n  HostName 10.1.2.3\nMatch host 10.1.2.*\n  Port 2203\n",
    "config user, then Match user": "Host target\n  User bob\nMatch user bob\n  Port 2204\n",
    "user decides HostName": "Match user alice\n  HostName alice.example\nMatch user bob\n  HostName bob.example\n",
}


@pytest.mark.parametrize("case", sorted(MATCHES))
@pytest.mark.parametrize("user", [None, "alice", "bob"])
def test_match_criteria_resolve_as_ssh_g(tmp_path: Path, case: str, user: str | None) -> None:
    cfg = tmp_path / "config"
    cfg.write_text(MATCHES[case])
    resolver = EndpointResolver(str(cfg))
    for name in ("target", "elsewhere"):
        assert_as_ssh(resolver, cfg, name, user)


def test_match_user_spawns_no_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_process(*a: Any, **kw: Any) -> Any:
        raise AssertionError("Match user is evaluated in process")

    cfg = tmp_path / "config"
    cfg.write_text(MATCHES["user"])
    monkeypatch.setattr(ssh_openssh.subprocess, "run", no_process)
    resolver = EndpointResolver(str(cfg))
    assert [resolver.endpoint(_node(f"n{i}", "alice")).port for i in range(50)] == [2200] * 50
    assert resolver.endpoint(_node("n1", "carol")).port == 22


# -- ProxyJump chains: each hop resolved as the ssh that ssh starts for it -------------------

JUMPS = """\
Host b0
  HostName 10.0.0.100
Host b1
  HostName 10.0.0.1
  User jumper
  Port 2022
  IdentityFile {d}/b1_key
  ProxyCommand nc -x proxy.example:1080 %h %p
Host b2
  HostName 10.0.0.2
  ProxyCommand never-used %h
  ProxyJump never-used-either
Host target
  HostName 10.0.0.3
  User alice
  ProxyJump b1,admin@b2:2200
Host deep
  ProxyJump b3
Host b3
  HostName 10.0.0.33
  ProxyJump b0
Host loop1
  ProxyJump loop2
Host loop2
  ProxyJump loop1
"""


def _hop(ep: Endpoint | None) -> tuple[str, int, str, str | None]:
    assert ep is not None
    return ep.host, ep.port, ep.user, ep.proxy_command


def _as_ssh(got: dict[str, list[str]]) -> tuple[str, int, str, str | None]:
    proxy = got.get("proxycommand", [None])[0]
    host, port = got["hostname"][0], got["port"][0]
    proxy = proxy.replace("%h", host).replace("%p", port) if proxy else None
    return host, int(port), _want_user(got, None), proxy


def test_proxy_jump_hops_resolve_as_ssh_does(tmp_path: Path) -> None:
    """``ssh -J b1,b2 t`` runs ``ssh -J b1 -W .. b2``, which runs ``ssh -W .. b1``: ssh -G of each."""
    (tmp_path / "b1_key").write_text("")
    cfg = tmp_path / "config"
    cfg.write_text(JUMPS.format(d=tmp_path))
    resolver = EndpointResolver(str(cfg))
    ep = resolver.endpoint(_node("target"))
    assert ssh_g(cfg, "target")["proxyjump"] == ["b1,admin@b2:2200"]
    assert (ep.host, ep.port, ep.user, ep.proxy_command) == ("10.0.0.3", 22, "alice", None)
    b2 = ep.jump
    assert _hop(b2) == _as_ssh(ssh_g(cfg, "b2", "-J", "b1", "-l", "admin", "-p", "2200"))
    assert _hop(b2) == ("10.0.0.2", 2200, "admin", None)  # its own ProxyCommand/ProxyJump overridden
    assert b2 is not None and b2.label == "jump host b2"
    b1 = b2.jump
    assert _hop(b1) == _as_ssh(ssh_g(cfg, "b1"))
    assert _hop(b1) == ("10.0.0.1", 2022, "jumper", "nc -x proxy.example:1080 10.0.0.1 2022")
    assert b1 is not None and b1.jump is None and b1.identities == (str(tmp_path / "b1_key"),)
    assert b2.identities == ()  # not the node's nor b1's: its own (none here; no default keys)

    deep = resolver.endpoint(_node("deep"))  # the first hop's own ProxyJump is followed
    assert deep.jump is not None and deep.jump.host == "10.0.0.33"
    assert deep.jump.jump is not None and deep.jump.jump.host == ssh_g(cfg, "b0")["hostname"][0]
    assert deep.jump.jump.jump is None

    with pytest.raises(SshConfigError, match=r"host loop1: ssh config ProxyJump loops: loop1 -> loop2 -> loop1"):
        resolver.endpoint(_node("loop1"))


def test_a_jump_host_s_match_user_sees_its_own_user(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text("Match user ops\n  Port 2022\nHost t\n  ProxyJump ops@b1\n  User alice\n")
    ep = EndpointResolver(str(cfg)).endpoint(_node("t"))
    assert ep.jump is not None and (ep.jump.user, ep.jump.port) == ("ops", 2022)
    assert int(ssh_g(cfg, "b1", "-l", "ops")["port"][0]) == 2022


# -- the system-wide file, read after the user's ----------------------------------------------

def _system(tmp_path: Path) -> tuple[Path, Path]:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host target\n  Port 2001\n")
    etc = tmp_path / "etc"
    (etc / "ssh_config.d").mkdir(parents=True)
    (etc / "ssh_config").write_text(f"Include {etc}/ssh_config.d/*.conf\nHost *\n  Port 2999\n  User sys\n")
    (etc / "ssh_config.d" / "10-site.conf").write_text("Host target other\n  HostName site.example\n")
    return home, etc / "ssh_config"


def test_the_system_config_is_read_after_the_user_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, system = _system(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    both = tmp_path / "both"  # ssh reads its two files as one that includes both
    both.write_text(f"Include {home}/.ssh/config\nInclude {system}\n")
    resolver = EndpointResolver(system_config=str(system))
    for name in ("target", "other", "third"):
        assert_as_ssh(resolver, both, name)
    assert resolver.endpoint(_node("target")).port == 2001  # the user's file first
    assert resolver.endpoint(_node("target")).host == "site.example"  # through the system's Include
    explicit = EndpointResolver(str(home / ".ssh" / "config"), system_config=str(system))
    assert _hop(explicit.endpoint(_node("other"))) == ("other", 22, DEFAULT_USER, None)  # like ssh -F


def test_ssh_g_reads_the_same_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host left to ``ssh -G`` is resolved from the user's and the system's files too."""
    home, system = _system(tmp_path)
    with open(system, "a") as fh:
        fh.write("Match originalhost ex* exec true\n  HostName exec.example\n")
    monkeypatch.setenv("HOME", str(home))
    calls: list[list[str]] = []
    real = subprocess.run

    def run(argv: list[str], **kw: Any) -> Any:
        calls.append(list(argv))
        return real(argv, **kw)

    monkeypatch.setattr(ssh_openssh.subprocess, "run", run)
    ep = EndpointResolver(system_config=str(system)).endpoint(_node("ex1"))
    assert (ep.host, ep.port, ep.user) == ("exec.example", 2999, "sys")
    assert len(calls) == 1 and "-F" in calls[0]  # HOME is not ssh's home: both files through one

    import os
    import pwd

    me = pwd.getpwuid(os.getuid())
    fake = pwd.struct_passwd((me.pw_name, me.pw_passwd, me.pw_uid, me.pw_gid, me.pw_gecos, str(home),
                              me.pw_shell))
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: fake)
    calls.clear()
    with open(home / ".ssh" / "config", "a") as fh:
        fh.write("Match originalhost ex* exec true\n  HostName exec.example\n")
    EndpointResolver(system_config="/etc/ssh/ssh_config").endpoint(_node("ex1"))
    assert len(calls) == 1 and "-F" not in calls[0]  # ssh's own two files: nothing to name


# -- keyword lines split as OpenSSH's readconf splits them ----------------------------------------

# OpenSSH ends a keyword at any whitespace or one ``=`` (with whitespace around it),
# in any case, reads the arguments with quotes and stops at a ``#`` word.
SEPARATORS = {
    # The reproducer: a tab-separated Host line in a file included under a block
    # that does not match keeps that block's condition.
    "tab Host in an included file": ("Host bastion-only\n  Include {d}/tab-host.conf\n", {}),
    "= Host in an included file": ("Host bastion-only\n  Include {d}/eq-host.conf\n", {}),
    "tab Host in a matching block's Include": ("Host target\n  Include {d}/tab-host.conf\n", {}),
    "tab Match in an included file": ("Host bastion-only\n  Include {d}/tab-match.conf\n", {}),
    "= Match in an included file": ("Host target\n  Include {d}/eq-match.conf\n", {}),
    "tab Include": ("Host target\n  Include\t{d}/star.conf\n", {}),
    "= Include": ("Host target\n  Include = {d}/star.conf\n", {}),
    "=Include, upper case": ("Host target\n  INCLUDE={d}/star.conf\n", {}),
    "quoted Include": ('Host target\n  Include "{d}/with space.conf"\n', {}),
    "tab Host then tab Include": ("Host\tother\n\tInclude\t{d}/star.conf\nHost=target\n  Port 2444\n", {}),
    "tab Match exec (left to ssh -G)": ("Match\texec false\n  Port 2555\nHost target\n  Port 2556\n", {}),
    "= Match exec (left to ssh -G)": ("Match=exec false\n  Port 2557\n", {}),
    "a comment after Host patterns": ("Host bastion-only # not *\n  Port 2666\n", {}),
    "quoted Host patterns": ('Host "tar*" \'oth*\'\n  Port 2777\n', {}),
    # A "#" word ends every line but a command's: paramiko would keep it in the value.
    "a comment after a value": ("Host target\n  User ops # the team\n  Port 2999 #c\n"
                                "  HostName real.example\t# c\n", {}),
    "a # inside a word is no comment": ("Host target\n  User o#ps\n", {}),
    "a comment after a quoted value": ('Host target\n  HostName "h.example" # c\n', {}),
    # A Host pattern is one word: "target,other" names neither (Match's lists would split it).
    "a comma in a Host pattern": ("Host target,other\n  Port 2121\n", {}),
    "a comma in an included Host pattern": ("Host *\n  Include {d}/comma-host.conf\n", {}),
}


@pytest.mark.parametrize("case", sorted(SEPARATORS))
@pytest.mark.parametrize("name", ["target", "other"])
def test_keyword_separators_resolve_as_ssh_g(tmp_path: Path, case: str, name: str) -> None:
    d = tmp_path
    (d / "star.conf").write_text("Host *\n  Port 2222\n")
    (d / "comma-host.conf").write_text("Host target,other\n  Port 2131\n")
    (d / "with space.conf").write_text("Port 2333\n")
    evil = "\tUser admin\n\tHostName evil.example\n"
    (d / "tab-host.conf").write_text("Host\t*\n" + evil)
    (d / "eq-host.conf").write_text("Host=*\n" + evil)
    (d / "tab-match.conf").write_text("Match\tall\n" + evil)
    (d / "eq-match.conf").write_text("Match = originalhost other\n" + evil + "Match\toriginalhost target\n"
                                     "  Port 2888\n")
    cfg = d / "config"
    cfg.write_text(SEPARATORS[case][0].format(d=d))
    assert_as_ssh(EndpointResolver(str(cfg)), cfg, name)


def test_a_proxy_command_keeps_its_hash_as_ssh_does(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text("Host target\n  ProxyCommand nc %h %p # not a comment here\n")
    ep = EndpointResolver(str(cfg)).endpoint(_node("target"))
    assert ssh_g(cfg, "target")["proxycommand"] == ["nc %h %p # not a comment here"]
    assert ep.proxy_command == "nc target 22 # not a comment here"  # %h %p expanded


@pytest.mark.parametrize("line", ["User #only a comment", 'User "unclosed'])
def test_a_value_line_ssh_refuses_is_refused(tmp_path: Path, line: str) -> None:
    cfg = tmp_path / "config"
    cfg.write_text(f"Host target\n  {line}\n")
    assert subprocess.run(["ssh", "-G", "-F", str(cfg), "target"], capture_output=True,
                          stdin=subprocess.DEVNULL).returncode != 0
    with pytest.raises(SshConfigError, match="cannot read"):
        EndpointResolver(str(cfg)).endpoint(_node("target"))


@pytest.mark.parametrize("line", ['Host\t"unclosed', "Host\xa0*"])
def test_a_host_line_ssh_refuses_is_refused_in_an_included_file(tmp_path: Path, line: str) -> None:
    """An unclosed quote, a keyword ended by no space or tab (paramiko would read ``Host *``)."""
    (tmp_path / "bad.conf").write_text(f"{line}\n  User admin\n")
    cfg = tmp_path / "config"
    cfg.write_text(f"Host bastion-only\n  Include {tmp_path}/bad.conf\n")
    assert subprocess.run(["ssh", "-G", "-F", str(cfg), "gpu1"], capture_output=True,
                          stdin=subprocess.DEVNULL).returncode != 0
    with pytest.raises(SshConfigError, match=r"bad\.conf: cannot read"):
        EndpointResolver(str(cfg)).endpoint(_node("gpu1"))


# -- file settings: ``~``, ``${VAR}`` and %-tokens, expanded as ssh expands them -------------------
#
# OpenSSH 9.2 expands IdentityFile and CertificateFile only when it connects (``ssh -G`` prints
# them as written: what it loads is in ``ssh -v``'s debug lines), UserKnownHostsFile and
# IdentityAgent before ``ssh -G`` prints them (a ``%%`` is printed as ``%``: final).

# A deferred Match that sets only what is already ssh's default: the same hosts, through ssh -G.
VIA_SSH_G = "Match exec true\n  Port 22\n"


def ssh_loads(cfg: Path, host: str) -> tuple[list[str], list[str], subprocess.CompletedProcess[str]]:
    """The identity and certificate files ``ssh`` loads for ``host``: its ``-v`` lines, from a
    connection whose ProxyCommand exits at once (the ``<key>-cert`` it tries beside a key left out)."""
    done = subprocess.run(["ssh", "-v", "-F", str(cfg), "-o", "BatchMode=yes", "-o", "ProxyCommand=false",
                           "--", host, "true"], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=30, check=False)
    ids = re.findall(r"^debug1: identity file (.*) type -?\d+$", done.stderr, re.MULTILINE)
    certs = re.findall(r"^debug1: certificate file (.*) type -?\d+$", done.stderr, re.MULTILINE)
    return [p for p in ids if not (p.endswith("-cert") and p[:-5] in ids)], certs, done


def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "keys%h~"  # what a variable holds is not read again: neither %h nor ~
    d.mkdir()
    monkeypatch.setenv("BRCTL_T_DIR", str(d))
    monkeypatch.delenv("BRCTL_T_UNSET", raising=False)
    return d


FILES = ("Host t*\n  HostName real.example\n  User bob\n  Port 2202\n"
         "  IdentityFile ${BRCTL_T_DIR}/id_%%h_%h_%n_%p_%r\n"
         "  IdentityFile ${BRCTL_T_DIR}/id_%C_%i_%L\n"
         "  CertificateFile ~/cert_%%h_%h_%d${BRCTL_T_DIR}\n"  # several: test_every_certificate_file_…
         "  UserKnownHostsFile ~/kh_%%h_%h %d/kh_%k ${BRCTL_T_DIR}/kh_%%x_%u\n")


@pytest.mark.parametrize("via_ssh_g", [False, True], ids=["paramiko", "ssh -G"])
def test_file_settings_expand_as_ssh_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, via_ssh_g: bool) -> None:
    """paramiko expanded IdentityFile's tokens one after the other (``%%h`` became ``%`` and the
    host name, then ``%r…`` the user) and not ``${VAR}``, CertificateFile's not at all; the
    ``ssh -G`` path expanded its printed UserKnownHostsFile a second time."""
    d = _env(tmp_path, monkeypatch)
    cfg = tmp_path / "config"
    cfg.write_text(FILES + (VIA_SSH_G if via_ssh_g else ""))
    ids, certs, _ = ssh_loads(cfg, "t1")
    assert len(ids) == 2 and len(certs) == 1 and ids[0] == f"{d}/id_%h_real.example_t1_2202_bob"
    for path in ids:  # the ssh -G path offers only the keys that exist, as ssh does
        Path(path).write_text("")
    resolver = EndpointResolver(str(cfg))
    assert resolver.spawns() is via_ssh_g
    ep = resolver.endpoint(_node("t1"))
    assert (list(ep.identities), list(ep.certificates)) == (ids, certs)
    assert list(ep.known_hosts[:3]) == ssh_g(cfg, "t1")["userknownhostsfile"][0].split()
    assert ep.known_hosts[2] == f"{d}/kh_%x_{getpass.getuser()}"


def test_ssh_g_prints_user_known_hosts_file_expanded_and_it_is_read_as_final(tmp_path: Path) -> None:
    """``ssh -G`` prints ``UserKnownHostsFile kh_%%h`` as ``kh_%h``: expanding that again read
    the host name into it (``%%x``: refused as an unknown token)."""
    cfg = tmp_path / "config"
    cfg.write_text(f"Match originalhost ex* exec true\n  HostName real.example\n"
                   f"  UserKnownHostsFile {tmp_path}/kh_%%h_%h {tmp_path}/kh_%%x\n"
                   f"  IdentityFile {tmp_path}/id_%%h\n")
    (tmp_path / "id_%h").write_text("")
    got = ssh_g(cfg, "ex1")
    assert got["userknownhostsfile"] == [f"{tmp_path}/kh_%h_real.example {tmp_path}/kh_%x"]
    assert got["identityfile"] == [f"{tmp_path}/id_%%h"]  # as written: ssh expands it when it connects
    ep = EndpointResolver(str(cfg)).endpoint(_node("ex1"))
    assert ep.known_hosts[:2] == (f"{tmp_path}/kh_%h_real.example", f"{tmp_path}/kh_%x")
    assert ep.identities == (f"{tmp_path}/id_%h",)


@pytest.mark.parametrize("via_ssh_g", [False, True], ids=["paramiko", "ssh -G"])
@pytest.mark.parametrize("line", ["IdentityFile ${BRCTL_T_UNSET}/id", "CertificateFile ${BRCTL_T_UNSET}/c",
                                  "UserKnownHostsFile ${BRCTL_T_UNSET}/kh",
                                  "IdentityAgent ${BRCTL_T_UNSET}/agent.sock"])
def test_an_unset_variable_in_a_file_setting_is_exit_2_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, via_ssh_g: bool) -> None:
    """ssh refuses it (``ssh -G`` for UserKnownHostsFile and IdentityAgent, the connection for
    IdentityFile and CertificateFile); read literally, the key or known_hosts file was another."""
    _env(tmp_path, monkeypatch)
    cfg = tmp_path / "config"
    cfg.write_text(f"Host t1\n  {line}\n" + (VIA_SSH_G if via_ssh_g else ""))
    _, _, done = ssh_loads(cfg, "t1")
    assert done.returncode == 255 and "env var ${BRCTL_T_UNSET} has no value" in done.stderr
    with pytest.raises(SshConfigError, match=r"^host t1: .*BRCTL_T_UNSET") as err:
        EndpointResolver(str(cfg)).endpoint(_node("t1"))
    assert err.value.code is ExitCode.USAGE
    if not (via_ssh_g and line.startswith("IdentityAgent")):  # ssh -G checks that one for every host
        EndpointResolver(str(cfg)).endpoint(_node("other"))  # that host only


@pytest.mark.parametrize("value", ["${BRCTL_T_DIR/kh", "${}/kh", "/kh_%"])
def test_an_expansion_ssh_refuses_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    _env(tmp_path, monkeypatch)
    cfg = tmp_path / "config"
    cfg.write_text(f"Host t1\n  UserKnownHostsFile {value}\n")
    assert subprocess.run(["ssh", "-G", "-F", str(cfg), "t1"], capture_output=True,
                          stdin=subprocess.DEVNULL).returncode == 255
    with pytest.raises(SshConfigError, match=r"^host t1: "):
        EndpointResolver(str(cfg)).endpoint(_node("t1"))


@pytest.mark.parametrize("via_ssh_g", [False, True], ids=["paramiko", "ssh -G"])
def test_identity_agent_is_expanded_as_ssh_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, via_ssh_g: bool) -> None:
    """``IdentityAgent ${SSH_AUTH_SOCK}`` is the agent brctl uses anyway; another socket is refused
    under the path ssh would use."""
    d = _env(tmp_path, monkeypatch)
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "agent.sock"))
    cfg = tmp_path / "config"
    cfg.write_text("Host own\n  IdentityAgent ${SSH_AUTH_SOCK}\nHost legacy\n  IdentityAgent $SSH_AUTH_SOCK\n"
                   "Host other\n  IdentityAgent ${BRCTL_T_DIR}/a_%%h_%h.sock\n" + (VIA_SSH_G if via_ssh_g else ""))
    resolver = EndpointResolver(str(cfg))
    assert resolver.endpoint(_node("own")).agent and resolver.endpoint(_node("legacy")).agent
    assert ssh_g(cfg, "other")["identityagent"] == [f"{d}/a_%h_other.sock"]
    with pytest.raises(SshConfigError, match=re.escape(f"'IdentityAgent {d}/a_%h_other.sock'")):
        resolver.endpoint(_node("other"))


# -- CertificateFile: every line that applies, in ssh's order ------------------------------------

CERTIFICATES = ("Host t*\n  CertificateFile /c/a1\n  CertificateFile /c/a2\n"
                "  CertificateFile ~/c/%%h_%h\nHost nomatch\n  CertificateFile /c/never\n"
                "Host *\n  CertificateFile /c/b1\n  CertificateFile /c/a1\n"  # a duplicate: once
                "  CertificateFile \"/c/q 1\"\n  CertificateFile '/c/q2' # a comment\n")


@pytest.mark.parametrize("via_ssh_g", [False, True], ids=["paramiko", "ssh -G"])
@pytest.mark.parametrize("name", ["t1", "other"])
def test_every_certificate_file_is_used_in_ssh_s_order(tmp_path: Path, via_ssh_g: bool, name: str) -> None:
    """OpenSSH uses every CertificateFile that applies (two lines of a block, two blocks), in the
    order it reads them, a duplicate once; paramiko's SSHConfig kept only the first."""
    cfg = tmp_path / "config"
    cfg.write_text(CERTIFICATES + (VIA_SSH_G if via_ssh_g else ""))
    _, certs, _ = ssh_loads(cfg, name)
    common = ["/c/b1", "/c/q 1", "/c/q2"]
    assert ssh_g(cfg, name)["certificatefile"] == (
        ["/c/a1", "/c/a2", "~/c/%%h_%h", *common] if name == "t1" else ["/c/b1", "/c/a1", *common[1:]])
    assert certs[2 if name == "t1" else 0] == (f"{Path.home()}/c/%h_t1" if name == "t1" else "/c/b1")
    ep = EndpointResolver(str(cfg)).endpoint(_node(name))
    assert list(ep.certificates) == certs


def test_a_certificate_file_line_with_two_paths_is_refused_as_ssh_does(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text("Host t1\n  CertificateFile /c/a /c/b\n")
    done = subprocess.run(["ssh", "-G", "-F", str(cfg), "other"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 255 and "extra arguments" in done.stderr
    with pytest.raises(SshConfigError, match="extra arguments"):
        EndpointResolver(str(cfg)).endpoint(_node("other"))


# -- ProxyCommand: %-tokens expanded by ssh, the rest read by the user's shell ---------------------

ARGV_PROXY = '#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$BRCTL_T_ARGV"\nexit 1\n'
# What the shell makes of a word is ssh's (a leading ``~``, ``~user``, a quoted ``~``); ``%%h`` is ``%h``.
PROXY_ARGS = ("%%h %h %p %r %n %%%% ~ ~/x a~b \"~/q\" '~'/w \\~/e ~root/z ~brctl-no-such-user/v "
              "a=~/y a=b:~/u --o=~/t x=\"~\" $BRCTL_T_ARGV # a comment, not arguments")


def _proxy_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shell: str) -> Path:
    home = tmp_path / "home dir"  # a space: the shell does not split what ``~`` gives
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "prox").write_text(ARGV_PROXY)
    (home / "bin" / "prox").chmod(0o755)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SHELL", shell)
    monkeypatch.setenv("BRCTL_T_ARGV", str(tmp_path / "argv"))
    return home


def _proxy_argv(tmp_path: Path) -> list[str]:
    argv = tmp_path / "argv"
    got = argv.read_text().splitlines()
    argv.unlink()
    return got


@pytest.mark.parametrize("via_ssh_g", [False, True], ids=["paramiko", "ssh -G"])
@pytest.mark.parametrize("shell", ["/bin/bash", "/bin/sh"])
def test_proxy_command_runs_with_the_arguments_ssh_gives_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, via_ssh_g: bool, shell: str) -> None:
    """ssh expands ProxyCommand's %-tokens in one pass and runs ``$SHELL -c "exec …"``, whose
    shell expands ``~`` and reads quotes and comments; paramiko replaced ``%h`` before ``%r``
    (``%%h`` became ``%`` and the user, then the host), left ``%n``, replaced a ``~`` anywhere
    (``a~b``, ``"~/q"``) and ran the words without a shell."""
    if not Path(shell).exists():
        pytest.skip(f"no {shell}")
    _proxy_home(tmp_path, monkeypatch, shell)
    cfg = tmp_path / "config"
    cfg.write_text(f"Host p1\n  HostName real.example\n  User bob\n  Port 2202\n"
                   f"  ProxyCommand ~/bin/prox {PROXY_ARGS}\n" + (VIA_SSH_G if via_ssh_g else ""))
    done = subprocess.run(["ssh", "-F", str(cfg), "-o", "BatchMode=yes", "p1", "true"], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=30, check=False)
    assert done.returncode == 255, done.stderr
    want = _proxy_argv(tmp_path)
    assert want[:6] == ["%h", "real.example", "2202", "bob", "p1", "%%"]
    ep = EndpointResolver(str(cfg)).endpoint(_node("p1"))
    assert ep.proxy_command is not None
    proxy = proxy_process(ep.proxy_command)  # as brctl runs it
    proxy.process.communicate(timeout=30)
    assert proxy.process.returncode == 1
    assert _proxy_argv(tmp_path) == want


@pytest.mark.parametrize("via_ssh_g", [False, True], ids=["paramiko", "ssh -G"])
@pytest.mark.parametrize("token", ["%d", "%u", "%C", "%Z"])
def test_a_token_ssh_refuses_in_a_proxy_command_is_refused(
        tmp_path: Path, via_ssh_g: bool, token: str) -> None:
    """ProxyCommand takes %%, %h, %n, %p and %r only: ssh stops at any other (``unknown key``)."""
    cfg = tmp_path / "config"
    cfg.write_text(f"Host p1\n  ProxyCommand nc {token} %p\n" + (VIA_SSH_G if via_ssh_g else ""))
    done = subprocess.run(["ssh", "-F", str(cfg), "-o", "BatchMode=yes", "p1", "true"], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=30, check=False)
    assert done.returncode == 255 and f"unknown key {token}" in done.stderr
    with pytest.raises(SshConfigError, match=rf"^host p1: .*{token}"):
        EndpointResolver(str(cfg)).endpoint(_node("p1"))
