"""ssh config resolution: where and how to connect to a node (``Endpoint``); no I/O but reading files.

``~/.ssh/config`` (path injectable: ``ssh_config``; ``None`` means
``~/.ssh/config`` when it exists, ``os.devnull`` disables it) is looked up by the
node's name, as ``ssh <name>`` would. Precedence, like OpenSSH's "command line
first": a value the inventory sets explicitly wins; a value the inventory leaves
at its default (``address`` equal to the name, ``user: root``, ``port: 22``, no
``identity_file``, no ``proxy_jump``) is taken from the ssh config when the
config has one. (The inventory cannot tell an explicit ``port: 22`` from the
default, so a config ``Port`` wins over it.) Honoured: HostName, User, Port,
IdentityFile, ProxyJump, ProxyCommand, UserKnownHostsFile, GlobalKnownHostsFile,
HostKeyAlias, CertificateFile, IdentityAgent none, in Host and Match blocks,
with Include expanded as ssh does. A host that a ``Match`` paramiko cannot
evaluate (``exec``, ``canonical``, ``final``, ...) may concern is resolved by
``ssh -G`` instead (``brctl.remote.ssh_openssh``); a setting brctl cannot
honour for a host (``IdentityAgent /path``, ``BindAddress``, a ``Match`` that
``ssh -G`` rejects, a ProxyJump it cannot read) is ``SshConfigError``: exit 2
naming the host and the setting, raised only for that host.

Keys: the inventory's ``identity_file``, else ssh config ``IdentityFile``, else
OpenSSH's default files (``~/.ssh/id_ed25519``, ``id_ecdsa``, ``id_rsa``) that exist;
user certificates: ssh config ``CertificateFile``, and ``<key>-cert.pub`` beside a key.

Host key files, as OpenSSH: the user files (the inventory's ``known_hosts``, else
ssh config ``UserKnownHostsFile``) and the global ones (``GlobalKnownHostsFile``,
else ``/etc/ssh/ssh_known_hosts``), looked up under ``HostKeyAlias`` when set;
under ``accept-new`` also ``<known_hosts>.brctl-accepted`` (``brctl.remote.ssh_connect``).

Jump hosts (``proxy_jump`` or ProxyJump): ``[user@]host[:port]`` hops, comma
separated as for ``ssh -J``, each resolved through the ssh config, become a chain
of ``Endpoint.jump``; a ProxyCommand applies only when there is no ProxyJump.
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from brctl.core.transport import Node
from brctl.remote.known_hosts import host_names
from brctl.remote.paramiko_lite import paramiko
from brctl.remote.ssh_openssh import DeferredMatch, SshConfigError, defer_matches, ssh_g, unsupported

DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
ACCEPTED_SUFFIX = ".brctl-accepted"
DEFAULT_USER = "root"
DEFAULT_PORT = 22
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"  # OpenSSH's default
USER_KNOWN_HOSTS = "~/.ssh/known_hosts"  # the inventory's default


@dataclass(frozen=True)
class Endpoint:
    """One SSH destination after ssh-config resolution."""

    label: str  # the node (or jump host) name, for messages
    host: str
    port: int
    user: str
    identities: tuple[str, ...]
    certificates: tuple[str, ...]  # CertificateFile: user certificates, paired with a key by its public half
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


def _trust(
    node: Node, cfg: Mapping[str, Any], host: str, port: int
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
    """``[user@]host[:port]`` → (user, host, port).

    Raises:
        ValueError: a port that is not a number.
    """
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
    if not host:
        raise ValueError("no host")
    return user, host, port


def identity_files(explicit: str | None, cfg: Mapping[str, Any]) -> tuple[str, ...]:
    """The identity files to offer: the inventory's, else the config's, else the defaults that exist."""
    if explicit:
        return (os.path.expanduser(explicit),)
    from_cfg = cfg.get("identityfile")
    if from_cfg:
        return tuple(os.path.expanduser(p) for p in from_cfg)
    found = [os.path.expanduser(p) for p in DEFAULT_IDENTITIES]
    return tuple(p for p in found if os.path.exists(p))


def _certificates(cfg: Mapping[str, Any]) -> tuple[str, ...]:
    """ssh config ``CertificateFile`` entries, expanded (missing ones are skipped at login, as ssh does)."""
    found = cfg.get("certificatefile") or ()
    return tuple(os.path.expanduser(p) for p in ([found] if isinstance(found, str) else found))


class EndpointResolver:
    """Resolves nodes to ``Endpoint``s through one ssh config file (parsed once; results cached).

    Args:
        ssh_config: ssh config file; None → ``~/.ssh/config`` if it exists;
            ``os.devnull`` to ignore any.
    """

    def __init__(self, ssh_config: str | None = None) -> None:
        self._config_path = os.path.expanduser(ssh_config or "~/.ssh/config")
        self._config: paramiko.SSHConfig | None = None
        self._deferred: tuple[DeferredMatch, ...] = ()
        self._lock = threading.Lock()
        self._endpoints: dict[tuple[object, ...], Endpoint] = {}

    def _ssh_config(self) -> paramiko.SSHConfig:
        """The parsed config (what paramiko may evaluate of it).

        Raises:
            SshConfigError: a file that cannot be read or parsed.
        """
        with self._lock:
            if self._config is None:
                if os.path.isfile(self._config_path):
                    try:
                        text = _with_includes(self._config_path, os.path.expanduser("~/.ssh"), 0)
                        text, self._deferred = defer_matches(text, self._config_path)
                        self._config = paramiko.SSHConfig.from_text(text)
                    except (ValueError, paramiko.SSHException) as exc:  # ConfigParseError too
                        raise SshConfigError(str(exc)) from None
                else:
                    self._config = paramiko.SSHConfig()
            return self._config

    def spawns(self) -> bool:
        """Whether some host may need ``ssh -G`` (the config has a Match paramiko cannot evaluate).

        Raises:
            SshConfigError: a file that cannot be read or parsed.
        """
        self._ssh_config()
        return bool(self._deferred)

    def _lookup(self, name: str, node: Node | None) -> Mapping[str, Any]:
        """``name``'s effective settings: paramiko's lookup, or ``ssh -G`` where a deferred Match may apply.

        ``node``: the inventory's node, for its explicit user/port and timeout (None for a jump host).
        """
        cfg: Mapping[str, Any] = self._ssh_config().lookup(name)
        hostname = str(cfg.get("hostname", name))
        if any(m.may_apply(name, hostname) for m in self._deferred):
            timeout = node.connect_timeout if node is not None else 10.0
            user = node.user if node is not None and node.user != DEFAULT_USER else None
            port = node.port if node is not None and node.port != DEFAULT_PORT else None
            cfg = ssh_g(self._config_path, name, user=user, port=port, timeout=timeout)
        bad = unsupported(cfg)
        if bad is not None:
            raise SshConfigError(
                f"host {name}: ssh config setting {bad!r} is not supported by brctl "
                "(it would reach the host differently from ssh)",
                hint="remove it for this host, or set the route in the inventory")
        return cfg

    def endpoint(self, node: Node) -> Endpoint:
        """Where and how to connect for ``node`` (inventory + ssh config; cached).

        Raises:
            SshConfigError: a setting brctl cannot honour or read for this node (exit 2).
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
            node.agent,
        )
        hit = self._endpoints.get(cache_key)
        if hit is not None:
            return hit
        cfg = self._lookup(node.name, node)
        host = node.address if node.address != node.name else cfg.get("hostname", node.address)
        user = node.user if node.user != DEFAULT_USER else cfg.get("user", node.user)
        port = node.port if node.port != DEFAULT_PORT else int(cfg.get("port", node.port))
        identities = identity_files(node.identity_file, cfg)
        certificates = _certificates(cfg)
        agent = node.agent and str(cfg.get("identityagent", "")).lower() != "none"
        jump_spec = node.proxy_jump if node.proxy_jump else cfg.get("proxyjump")
        jump = None
        if jump_spec and jump_spec.lower() != "none":
            for hop in jump_spec.split(","):  # b1,b2: b1 first, b2 reached through it
                try:
                    juser, jhost, jport = _parse_jump(hop.strip())
                except ValueError:
                    where = "the inventory's proxy_jump" if node.proxy_jump else "ssh config ProxyJump"
                    raise SshConfigError(f"host {node.name}: {where} {jump_spec!r}: cannot read hop "
                                         f"{hop.strip()!r} (expected [user@]host[:port])") from None
                jcfg = self._lookup(jhost, None)
                jhost_addr = jcfg.get("hostname", jhost)
                jport = jport or int(jcfg.get("port", DEFAULT_PORT))
                files, accepted, names = _trust(node, jcfg, jhost_addr, jport)
                jump = Endpoint(
                    label=f"jump host {jhost}",
                    host=jhost_addr,
                    port=jport,
                    user=juser or jcfg.get("user", user),
                    identities=identity_files(None, jcfg) if "identityfile" in jcfg else identities,
                    certificates=_certificates(jcfg) if "certificatefile" in jcfg else certificates,
                    policy=node.host_key_policy,
                    connect_timeout=node.connect_timeout,
                    jump=jump,
                    agent=agent,
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
            certificates=certificates,
            policy=node.host_key_policy,
            connect_timeout=node.connect_timeout,
            jump=jump,
            agent=agent,
            known_hosts=files,
            accepted=accepted,
            key_names=names,
            proxy_command=str(proxy) if proxy and str(proxy).lower() != "none" else None,
        )
        self._endpoints[cache_key] = ep
        return ep
