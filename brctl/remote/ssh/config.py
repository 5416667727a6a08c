"""ssh config resolution: where and how to connect to a node (``Endpoint``); no I/O but reading files.

``~/.ssh/config`` then ``/etc/ssh/ssh_config`` (the first value obtained wins,
as in OpenSSH; an explicit ``ssh_config`` path is read alone, like ``ssh -F``,
and ``os.devnull`` disables both) is looked up by the node's name, as ``ssh
<name>`` would; ``Match user`` sees the inventory's explicit user, as ssh's does
``-l``. Precedence, like OpenSSH's "command line
first": a value the inventory sets explicitly wins; a value the inventory leaves
at its default (``address`` equal to the name, ``user: root``, ``port: 22``, no
``identity_file``, no ``proxy_jump``) is taken from the ssh config when the
config has one. (The inventory cannot tell an explicit ``port: 22`` from the
default, so a config ``Port`` wins over it.) Honoured: HostName, User, Port,
IdentityFile, ProxyJump, ProxyCommand, UserKnownHostsFile, GlobalKnownHostsFile,
HostKeyAlias, CertificateFile, IdentityAgent none, in Host and Match blocks,
with Include expanded as ssh does. A host that a ``Match`` paramiko cannot
evaluate (``exec``, ``canonical``, ``final``, ...) may concern is resolved by
``ssh -G`` instead (``brctl.remote.ssh.openssh``); a setting brctl cannot
honour for a host (``IdentityAgent /path``, ``BindAddress``, a ``Match`` that
``ssh -G`` rejects, a ProxyJump it cannot read) is ``SshConfigError``: exit 2
naming the host and the setting, raised only for that host.

Keys: the inventory's ``identity_file``, else ssh config ``IdentityFile``, else
OpenSSH's default files (``~/.ssh/id_ed25519``, ``id_ecdsa``, ``id_rsa``) that exist;
user certificates: every ssh config ``CertificateFile`` that applies, in the order ssh
reads them, each once (paramiko keeps only the first: ``ssh_openssh.Config``), and ``<key>-cert.pub``
beside a key.

Paths, as OpenSSH: ``~``, ``${VAR}`` and %-tokens are expanded in IdentityFile,
CertificateFile, UserKnownHostsFile and IdentityAgent (``ssh_openssh.expand_path``;
paramiko, which would expand some of them its own way, leaves them as written: ``ssh_openssh.Config``);
an unset variable is ``SshConfigError`` for that host, as ssh refuses it.

ProxyCommand, as OpenSSH: its %-tokens (``%%``, ``%h``, ``%n``, ``%p``, ``%r``; any other
is ``SshConfigError``, as ssh stops at it) are replaced in one pass
(``ssh_openssh.proxy_command``; not paramiko's way: ``ssh_openssh.Config``), and it runs as ssh runs
it, ``$SHELL -c "exec COMMAND"`` (``ssh_connect.proxy_process``): the shell does the rest
(``~``, ``$VAR``, quotes, a ``#`` comment).

Host key files, as OpenSSH: the user files (the inventory's ``known_hosts``, else
ssh config ``UserKnownHostsFile``, else ``~/.ssh/known_hosts`` and ``known_hosts2``;
``none``: no user file) and the global ones (``GlobalKnownHostsFile``, else
``/etc/ssh/ssh_known_hosts``), looked up under ``HostKeyAlias`` when set; under ``accept-new`` also
``<known_hosts>.brctl-accepted`` (``brctl.remote.ssh.connect``).

Jump hosts (``proxy_jump`` or ProxyJump): ``[user@]host[:port]`` hops, comma
separated as for ``ssh -J``, each resolved by its own name through the ssh
config (its own User, Port, HostName, IdentityFile; not the node's user), become
a chain of ``Endpoint.jump``; the first hop is reached by its own ProxyJump or
ProxyCommand (``EndpointResolver._chain``); a ProxyCommand applies only when
there is no ProxyJump.
"""

from __future__ import annotations

import glob
import os
import pwd
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from brctl.core.transport import Node
from brctl.remote.ssh.known_hosts import host_names
from brctl.remote.ssh.openssh import (
    COMMAND_KEYWORDS,
    EVALUATED_ONCE,
    Config,
    DeferredMatch,
    SshConfigError,
    config_line,
    defer_matches,
    expanded,
    quote_arg,
    split_args,
    ssh_g,
    tests_settable,
    unsupported,
)
from brctl.remote.ssh.paramiko_lite import paramiko

DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
ACCEPTED_SUFFIX = ".brctl-accepted"
DEFAULT_USER = "root"
DEFAULT_PORT = 22
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"  # OpenSSH's default
USER_KNOWN_HOSTS = "~/.ssh/known_hosts"  # the inventory's default
DEFAULT_USER_KNOWN_HOSTS = "~/.ssh/known_hosts ~/.ssh/known_hosts2"  # OpenSSH's default


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
    proxy_command: str | None = None  # ssh config ProxyCommand (when no ProxyJump), %-tokens expanded
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
    its default, else ssh config ``UserKnownHostsFile``, else ``~/.ssh/known_hosts`` and
    ``…2``; ``none``: no user file), then the global ones (``GlobalKnownHostsFile``,
    else ``/etc/ssh/ssh_known_hosts`` and ``…2``); ``HostKeyAlias`` replaces the looked-up name. The
    ``.brctl-accepted`` file beside the first user file is trusted, and written,
    only under ``accept-new`` (with no user file, or ``/dev/null``, as ``strict``).
    """
    if node.known_hosts and node.known_hosts != USER_KNOWN_HOSTS:
        user_files = [os.path.expanduser(node.known_hosts)]
    elif "userknownhostsfile" in cfg:  # expanded already (``_lookup``): a ``~`` left in it is a name
        user_files = str(cfg["userknownhostsfile"]).split()
    else:
        user_files = [os.path.expanduser(f) for f in DEFAULT_USER_KNOWN_HOSTS.split()]
    global_files = [os.path.expanduser(f)
                    for f in str(cfg.get("globalknownhostsfile", GLOBAL_KNOWN_HOSTS)).split()]
    # ``none`` alone: no such files (never a file named "none" in the current directory).
    user_files, global_files = ([] if fs == ["none"] else fs for fs in (user_files, global_files))
    files = [*user_files, *global_files]
    accepted = None
    # none, or /dev/null (where ssh "records" a key to forget it): nowhere to record, so strict
    if node.host_key_policy == "accept-new" and user_files and files[0] != os.devnull:
        accepted = files[0] + ACCEPTED_SUFFIX
        files.append(accepted)
    alias = cfg.get("hostkeyalias")
    names = (str(alias),) if alias else tuple(host_names(host, port))
    return tuple(files), accepted, names


INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH


def _condition(keyword: str, args: list[str]) -> str | None:
    """A Host/Match line's condition (its arguments, as ``config_args`` reads them) as ``Match`` criteria.

    None: every host. ``Host p1 p2`` matches the name as given, which is ``Match
    originalhost p1,p2`` (no pattern: no host); ``all`` is dropped so the criteria
    can be joined to others (paramiko stops at it).
    """
    if keyword == "host":
        # A Host pattern is one word, a comma in it a literal one: no host name matches it
        # (``Host a,b`` is neither a nor b), where Match's lists would split it.
        return "originalhost " + quote_arg(",".join(a for a in args if "," not in a) or "!*")
    # ``all`` only alone or after canonical/final, which take no arguments
    return " ".join(quote_arg(w) for w in args if w.lower() != "all") or None


def _both(outer: str | None, inner: str | None) -> str | None:
    return inner if outer is None else outer if inner is None else f"{outer} {inner}"


def _header(condition: str | None) -> str:
    return "Host *" if condition is None else f"Match {condition}"


def _header_again(repeated: str | None, fresh: str | None = None) -> str:
    """The header of ``repeated`` (a condition OpenSSH met earlier in the file) and
    ``fresh`` (one met here): if ``repeated`` tests a HostName or User the lines since
    may have set, paramiko's answer here may not be OpenSSH's, so the block is left to
    ``ssh -G`` (``EVALUATED_ONCE``: ``defer_matches`` defers it)."""
    whole = _both(repeated, fresh)
    if repeated is not None and tests_settable(repeated):
        whole = f"{whole} {EVALUATED_ONCE}"
    return _header(whole)


def _read_line(line: str) -> tuple[str, list[str], str]:
    """(keyword, its arguments for Host/Match/Include, the line as paramiko should see it).

    As OpenSSH's readconf: any whitespace or "=" after the keyword, quoted arguments, a
    "#" word ending every line but a command's (paramiko would keep it in the value).

    Raises:
        ValueError: a line ssh refuses.
    """
    keyword, rest = config_line(line) or ("", "")
    if not keyword or keyword in COMMAND_KEYWORDS:
        return keyword, [], line
    args, end = split_args(rest)
    kept = rest[:end].rstrip(" \t")
    if not kept:
        raise ValueError(f"no argument after keyword {keyword!r}")
    if kept != rest:
        line = f"{keyword} {kept}"
    return keyword, args if keyword in ("host", "match", "include") else [], line


def _with_includes(path: str, base: str, depth: int, guard: str | None = None) -> str:
    """The ssh config at ``path`` with its ``Include`` lines replaced by the files they name.

    As OpenSSH: relative paths are under ``base`` (``~/.ssh`` for the user's file),
    globs expand in sorted order, missing files are skipped. An included file is
    read in the state of the block that includes it (``guard``: that block's
    condition; None: every host): under a block that does not match, none of it
    applies, its own Host/Match lines included; under one that does, its own
    Host/Match lines decide for the rest of that file; after it the enclosing
    block resumes. paramiko knows no nesting, so each block of an included file
    becomes a ``Match`` of both conditions, and the enclosing block's header is
    repeated at its start and after it. A repeated condition that tests a host or
    user is evaluated once by OpenSSH, where it stood, but again by paramiko, maybe
    after the block (before the Include) or the file set HostName or User: such a
    block is left to ``ssh -G``.
    """
    if depth > INCLUDE_DEPTH:
        raise ValueError(f"ssh config {path}: Include nested deeper than {INCLUDE_DEPTH}")
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as fh:
            lines = fh.read().split("\n")  # ssh's lines end at a newline only
    except OSError as exc:
        raise ValueError(f"ssh config {path}: {exc.strerror}") from None
    current = guard  # the condition the lines at this point of the file apply under
    resume = _header_again(guard)  # the header again, after an Include in this block
    out = [resume]  # a file starts in its includer's state, whatever block came last
    for line in lines:
        try:
            keyword, args, line = _read_line(line)
        except ValueError as exc:
            raise ValueError(f"ssh config {path}: cannot read {line.strip()!r}: {exc}") from None
        if keyword in ("host", "match"):
            own = _condition(keyword, args)
            current = _both(guard, own)
            if guard is None and keyword == "host":
                resume = "Host " + (" ".join(quote_arg(a) for a in args) or "!*")
                out.append(resume)  # written anew: paramiko splits lines its own way
            else:
                out.append(_header_again(guard, own))
                resume = _header_again(current)
        elif keyword == "include":
            for pattern in args:
                full = os.path.expanduser(pattern)
                if not os.path.isabs(full):
                    full = os.path.join(base, full)
                for found in sorted(glob.glob(full)):
                    if os.path.isfile(found):
                        out.append(_with_includes(found, base, depth + 1, current))
            out.append(resume)  # the including block resumes
        else:
            out.append(line)
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
    """The identity files to offer: the inventory's, else the config's (expanded already:
    ``_lookup``), else the defaults that exist."""
    if explicit:
        return (os.path.expanduser(explicit),)
    from_cfg = cfg.get("identityfile")
    if from_cfg:
        return tuple(from_cfg)
    found = [os.path.expanduser(p) for p in DEFAULT_IDENTITIES]
    return tuple(p for p in found if os.path.exists(p))


def _certificates(cfg: Mapping[str, Any]) -> tuple[str, ...]:
    """ssh config ``CertificateFile`` entries, expanded already (``_lookup``; missing ones are
    skipped at login, as ssh does)."""
    found = cfg.get("certificatefile") or ()
    return tuple([found] if isinstance(found, str) else found)


SYSTEM_CONFIG = "/etc/ssh/ssh_config"  # OpenSSH's system-wide file, read after the user's
JUMP_DEPTH = 16  # hops through jump hosts' own ProxyJump, at most (a loop is refused sooner)


def _seedable(user: str) -> bool:
    """Whether ``user`` can be written as a ``User`` line as it stands."""
    return bool(user) and not any(c.isspace() or c in "\"'#=\\" for c in user)


class EndpointResolver:
    """Resolves nodes to ``Endpoint``s through the ssh config files (parsed once; results cached).

    As OpenSSH: without an explicit file the user's ``~/.ssh/config`` is read, then
    the system's ``/etc/ssh/ssh_config`` (with its ``Include`` of
    ``ssh_config.d/*.conf``), the first value obtained winning; an explicit file,
    like ``ssh -F``, is read alone.

    Args:
        ssh_config: ssh config file; None → ``~/.ssh/config`` if it exists, then
            ``system_config``; ``os.devnull`` to ignore any.
        system_config: the system-wide file read after the user's (tests point it
            elsewhere); not read when ``ssh_config`` is given.
    """

    def __init__(self, ssh_config: str | None = None, *, system_config: str = SYSTEM_CONFIG) -> None:
        self._config_path = os.path.expanduser(ssh_config or "~/.ssh/config")
        self._system_path = None if ssh_config else system_config
        self._text: str | None = None
        self._configs: dict[str | None, paramiko.SSHConfig] = {}
        self._deferred: tuple[DeferredMatch, ...] = ()
        self._ssh_g_files: tuple[str, ...] = ()
        self._wrapper: tempfile.TemporaryDirectory[str] | None = None
        self._lock = threading.Lock()
        self._endpoints: dict[tuple[object, ...], Endpoint] = {}

    def _config_text(self) -> str:
        """The config text paramiko may evaluate (Includes expanded, deferred Matches neutralised).

        Raises:
            SshConfigError: a file that cannot be read or parsed.
        """
        if self._text is None:
            parts: list[str] = []
            try:
                if os.path.isfile(self._config_path):
                    parts.append(_with_includes(self._config_path, os.path.expanduser("~/.ssh"), 0))
                if self._system_path and os.path.isfile(self._system_path):
                    # Relative Includes of the system file are under its own directory (/etc/ssh).
                    parts.append(_with_includes(self._system_path, os.path.dirname(self._system_path), 0))
                text, self._deferred = defer_matches("\n".join(parts), self._config_path)
            except ValueError as exc:
                raise SshConfigError(str(exc)) from None
            if self._deferred:
                self._ssh_g_files = self._files_for_ssh_g()
            self._text = text
        return self._text

    def _files_for_ssh_g(self) -> tuple[str, ...]:
        """The ``-F`` arguments that make ``ssh -G`` read the files this resolver reads."""
        if self._system_path is None:
            return ("-F", self._config_path)
        own = os.path.join(pwd.getpwuid(os.getuid()).pw_dir, ".ssh", "config")
        if self._system_path == SYSTEM_CONFIG and os.path.abspath(self._config_path) == own:
            return ()  # ssh's own defaults: the same two files
        # ``$HOME`` is not ssh's home (it uses the password database) or the system
        # file is elsewhere: one file including both reads them as ssh reads its two.
        self._wrapper = tempfile.TemporaryDirectory(prefix="brctl-ssh-config-")
        path = os.path.join(self._wrapper.name, "config")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(f"Include {quote_arg(self._config_path)}\nInclude {quote_arg(self._system_path)}\n")
        return ("-F", path)

    def _ssh_config(self, user: str | None = None) -> paramiko.SSHConfig:
        """The parsed config; with ``user``, as ``ssh -l user`` reads it.

        ``-l`` sets the user before any file is read, so ``Match user`` sees it:
        here a leading ``User`` line, one parse per distinct explicit user.

        Raises:
            SshConfigError: a file that cannot be read or parsed.
        """
        with self._lock:
            config = self._configs.get(user)
            if config is None:
                text = self._config_text()
                if user is not None:
                    text = f"User {user}\n{text}"
                try:
                    config = self._configs[user] = Config.from_text(text)
                except paramiko.SSHException as exc:  # ConfigParseError
                    raise SshConfigError(f"ssh config {self._config_path}: {exc}") from None
            return config

    def spawns(self) -> bool:
        """Whether some host may need ``ssh -G`` (the config has a Match paramiko cannot evaluate).

        Raises:
            SshConfigError: a file that cannot be read or parsed.
        """
        self._ssh_config()
        return bool(self._deferred)

    def _lookup(self, name: str, *, user: str | None, port: int | None, timeout: float) -> Mapping[str, Any]:
        """``name``'s effective settings: paramiko's lookup, or ``ssh -G`` where a deferred Match may apply.

        ``user``/``port``: given as on ssh's command line (``-l``/``-p``): the
        inventory's explicit values, or a jump host's ``user@host:port``.

        Raises:
            SshConfigError: a setting brctl cannot honour, or ``ssh -G`` refused.
        """
        if user is not None and not _seedable(user):
            raise SshConfigError(f"host {name}: user {user!r} cannot be matched against the ssh config")
        cfg: Mapping[str, Any] = self._ssh_config(user).lookup(name)
        hostname = str(cfg.get("hostname", name))
        if any(m.may_apply(name, hostname) for m in self._deferred):
            cfg = ssh_g(self._ssh_g_files, name, user=user, port=port, timeout=timeout)
        else:
            cfg = expanded(cfg, name, user=user, port=port)
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
        explicit_user = node.user if node.user != DEFAULT_USER else None
        explicit_port = node.port if node.port != DEFAULT_PORT else None
        cfg = self._lookup(node.name, user=explicit_user, port=explicit_port, timeout=node.connect_timeout)
        host = node.address if node.address != node.name else cfg.get("hostname", node.address)
        user = explicit_user or cfg.get("user", node.user)
        port = node.port if node.port != DEFAULT_PORT else int(cfg.get("port", node.port))
        jump_spec = node.proxy_jump if node.proxy_jump else cfg.get("proxyjump")
        where = "the inventory's proxy_jump" if node.proxy_jump else "ssh config ProxyJump"
        ep = self._endpoint(node, node.name, cfg, host=host, port=port, user=user,
                            identities=identity_files(node.identity_file, cfg),
                            route=(jump_spec, where, (node.name,)))
        self._endpoints[cache_key] = ep
        return ep

    def _endpoint(self, node: Node, name: str, cfg: Mapping[str, Any], *, host: str, port: int, user: str,
                  identities: tuple[str, ...],
                  route: tuple[str | None, str, tuple[str, ...]] | Endpoint | None) -> Endpoint:
        """The ``Endpoint`` of ``name`` (the node or a jump host) once its settings are known.

        ``route``: an ``Endpoint`` to reach it through (a later hop of a chain);
        else (ProxyJump spec, where it came from, names on the way so far): its
        own ProxyJump, or its ProxyCommand when it has none.
        """
        jump, proxy = None, None
        if isinstance(route, Endpoint):
            jump = route
        elif route is not None:
            spec, where, seen = route
            if spec and str(spec).lower() != "none":
                jump = self._chain(node, name, str(spec), where, seen)
            else:
                proxy = cfg.get("proxycommand")
        files, accepted, names = _trust(node, cfg, host, port)
        return Endpoint(
            label=name if name == node.name else f"jump host {name}",
            host=host,
            port=port,
            user=user,
            identities=identities,
            certificates=_certificates(cfg),
            policy=node.host_key_policy,
            connect_timeout=node.connect_timeout,
            jump=jump,
            agent=node.agent and str(cfg.get("identityagent", "")).lower() != "none",
            known_hosts=files,
            accepted=accepted,
            key_names=names,
            proxy_command=str(proxy) if proxy and str(proxy).lower() != "none" else None,
        )

    def _chain(self, node: Node, name: str, spec: str, where: str, seen: tuple[str, ...]) -> Endpoint:
        """The last hop of ``name``'s ProxyJump chain ``spec`` (``b1,b2``), reached through the others.

        As OpenSSH, which runs ``ssh -J b1 -W host:port b2``: every hop is resolved
        by its own name through the ssh config (HostName, Port, User, IdentityFile,
        CertificateFile, known-hosts files), ``user@``/``:port`` in the spec winning;
        the node's own user does not apply (a hop with neither is brctl's default
        user, root, where ssh would take the local login). Only the first hop is
        reached by its own ProxyJump or ProxyCommand (later hops are reached through
        the previous one, which overrides theirs); a loop of them is refused. A hop
        without IdentityFile is offered the inventory's ``identity_file``, else
        OpenSSH's default keys.

        Raises:
            SshConfigError: a hop that cannot be read, a loop, or a hop's setting brctl
                cannot honour.
        """
        via: Endpoint | None = None
        for i, hop in enumerate(h.strip() for h in spec.split(",")):
            try:
                juser, jname, jport = _parse_jump(hop)
            except ValueError:
                raise SshConfigError(f"host {seen[0]}: {where} {spec!r}: cannot read hop "
                                     f"{hop!r} (expected [user@]host[:port])") from None
            jcfg = self._lookup(jname, user=juser, port=jport, timeout=node.connect_timeout)
            route: tuple[str | None, str, tuple[str, ...]] | Endpoint | None = via
            if i == 0:
                own = jcfg.get("proxyjump")
                if own and str(own).lower() != "none" and (jname in seen or len(seen) > JUMP_DEPTH):
                    raise SshConfigError(f"host {seen[0]}: ssh config ProxyJump loops: "
                                         f"{' -> '.join((*seen, jname))} -> ...")
                route = (own, f"ssh config ProxyJump of jump host {jname}", (*seen, jname))
            via = self._endpoint(
                node, jname, jcfg,
                host=str(jcfg.get("hostname", jname)),
                port=jport or int(jcfg.get("port", DEFAULT_PORT)),
                user=juser or str(jcfg.get("user", DEFAULT_USER)),
                identities=identity_files(None if "identityfile" in jcfg else node.identity_file, jcfg),
                route=route)
        assert via is not None  # split() gives at least one hop
        return via
