"""ssh config settings paramiko cannot evaluate: found in the text, resolved through ``ssh -G``.

paramiko's ``SSHConfig`` runs ``Match exec`` itself (through ``invoke``) and
treats a ``Match`` criterion it does not know (``localnetwork``, ``tagged``) as
matching. So before paramiko sees the text, every ``Match`` line with a
criterion other than ``all``/``host``/``originalhost``/``user``/``localuser``
(``exec``, ``canonical``, ``final``, ``localnetwork``, ...) is replaced by one
that never matches (its block stays a block), and the hosts such a block may
apply to — its ``host``/``originalhost`` criteria before the first deferred one
do not rule them out, and that sets something brctl reads (``READ``) — are
resolved by ``ssh -G HOST`` instead: one process per
such host, none for a plain config (``SshTransport.check_config`` runs up to 16
at once before a fan-out); what it prints as written, because ssh expands it only
when it connects (``ProxyCommand nc %h %p``, IdentityFile, CertificateFile), is
expanded as ssh would (``proxy_command``, ``expand_path``); what it prints expanded
already (UserKnownHostsFile, IdentityAgent: a configured ``%%`` printed as ``%``)
is final. What ``ssh -G`` rejects (an OpenSSH too old
for ``Match localnetwork``, a ``Match exec`` that hangs) is ``SshConfigError``.

``unsupported`` names the effective settings brctl cannot honour (they would
make it connect differently from ``ssh``): refused with exit 2, host by host.

``config_line``/``config_args`` split a config line as OpenSSH's readconf does
(a keyword ends at a space, a tab or one ``=``; arguments are quoted words up to
a ``#`` word), for every line brctl reads itself (Host, Match, Include).
"""

from __future__ import annotations

import functools
import getpass
import hashlib
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from brctl.core.errors import InputError
from brctl.remote.ssh.known_hosts import match_patterns
from brctl.remote.ssh.paramiko_lite import paramiko

PARAMIKO_CRITERIA = frozenset({"all", "host", "originalhost", "user", "localuser"})
NO_ARGUMENT = frozenset({"all", "canonical", "final"})
NEVER_MATCHES = "Match originalhost !*"
MULTI_VALUED = frozenset({"identityfile", "certificatefile"})
# What brctl reads of a host's settings (and refuses: ``unsupported``), and what
# later blocks match on. A deferred block that sets none of these (Fedora's
# ``Match final all`` around its crypto policy: Ciphers, SendEnv, ...) cannot
# change where or how brctl connects, so it sends no host to ``ssh -G``.
READ = frozenset({
    "hostname", "user", "port", "identityfile", "certificatefile", "proxyjump", "proxycommand",
    "userknownhostsfile", "globalknownhostsfile", "hostkeyalias", "identityagent", "addressfamily",
    "knownhostscommand", "pkcs11provider", "bindaddress", "bindinterface", "proxyusefdpass",
})
# Of what brctl reads, the files ssh expands ``~``, ``${VAR}`` and %-tokens in (ssh_config(5),
# ENVIRONMENT VARIABLES; KnownHostsCommand too, but brctl refuses it whatever it says).
PATHS = ("identityfile", "certificatefile", "userknownhostsfile", "identityagent")
# The %-tokens ssh expands in ProxyCommand (ssh_config(5), TOKENS: it stops at any other).
PROXY_TOKENS = "%hnpr"
# ``ssh -G`` prints these as written (ssh expands them only when it connects); it prints
# the other PATHS expanded already (OpenSSH 9.2), so expanding those again misreads them.
TOKENISED = ("identityfile", "certificatefile")


class SshConfigError(InputError):
    """An ssh config setting brctl cannot honour or evaluate for a host (exit 2)."""


# readconf's strdelim: the keyword ends at whitespace or ``=`` (one ``=``, with
# whitespace around it, may separate it from its arguments).
_KEYWORD = re.compile(r"[ \t\r]*([^ \t\r\"=]+)(?:[ \t\r]*=|[ \t\r])[ \t\r]*(.*)", re.DOTALL)
_WORD = re.compile(r"\w+", re.ASCII)


def config_line(line: str) -> tuple[str, str] | None:
    """``(keyword, arguments)`` of an ssh config line, as OpenSSH reads it; None: blank or comment.

    The keyword is lower-cased (OpenSSH's are case-insensitive); the arguments
    are the rest of the line, for ``config_args``.

    Raises:
        ValueError: what ssh refuses too: a keyword without arguments, or one that
            is no word (``Host\xa0*``, which paramiko would read as ``Host``).
    """
    line = line.rstrip(" \t\r\n\f")
    match = _KEYWORD.match(line)
    keyword = match.group(1) if match else line.strip(" \t\r")
    if not keyword or keyword.startswith("#"):
        return None
    if not _WORD.fullmatch(keyword):
        raise ValueError(f"unknown keyword {keyword!r}")
    if match is None or not match.group(2):
        raise ValueError(f"no argument after keyword {keyword!r}")
    return keyword.lower(), match.group(2)


def config_args(text: str) -> list[str]:
    """An ssh config line's arguments, as OpenSSH's ``argv_split`` reads them.

    Words are separated by spaces and tabs; ``"`` or ``'`` quote; a backslash
    escapes a quote, a backslash or (unquoted) a space, and is kept before any
    other character; a word starting with ``#`` ends the line.

    Raises:
        ValueError: a quote that is not closed.
    """
    return split_args(text)[0]


# Keywords whose value is the raw rest of the line, "#" and all (OpenSSH's readconf).
COMMAND_KEYWORDS = frozenset({"proxycommand", "localcommand", "remotecommand", "knownhostscommand"})


def split_args(text: str) -> tuple[list[str], int]:
    """``config_args``'s words, and where they end in ``text``: a comment's "#" (``User ops
    # the team``: what ssh keeps of the line is ``text[:end]``), or the end of the text.

    Raises:
        ValueError: a quote that is not closed (ssh refuses such a line whatever its keyword).
    """
    args: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] in " \t":
            i += 1
            continue
        if text[i] == "#":
            break
        quote = ""
        word: list[str] = []
        while i < n:
            c = text[i]
            if c == "\\" and i + 1 < n and (text[i + 1] in "'\"\\" or (not quote and text[i + 1] == " ")):
                word.append(text[i + 1])
                i += 2
                continue
            if not quote and c in " \t":
                break
            if not quote and c in "\"'":
                quote = c
            elif quote and c == quote:
                quote = ""
            else:
                word.append(c)
            i += 1
        if quote:
            raise ValueError("no closing quotation")
        args.append("".join(word))
    return args, i


def quote_arg(word: str) -> str:
    """``word`` written so that ``config_args`` and paramiko's ``shlex.split`` both read it back.

    In double quotes both take ``\\\\`` and ``\\"`` as escapes and every other character as it is.
    """
    if word and not re.search(r"[\s\"'\\#]", word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class DeferredMatch:
    """A ``Match`` line left to ``ssh -G``, with the criteria that decide whom it may concern."""

    line: str
    hosts: tuple[tuple[str, bool, tuple[str, ...]], ...]  # (host|originalhost, negated, patterns)

    def may_apply(self, name: str, hostname: str) -> bool:
        """False only when a host criterion before the deferred one surely fails for this host."""
        for kind, negated, patterns in self.hosts:
            candidates = (name,) if kind == "originalhost" else (name, hostname)
            if not any(match_patterns(c.lower(), patterns) != negated for c in candidates):
                return False
        return True


def _criteria(words: list[str]) -> list[tuple[str, bool, str | None]]:
    """``Match`` words → (criterion, negated, argument)."""
    out: list[tuple[str, bool, str | None]] = []
    i = 0
    while i < len(words):
        word = words[i].lower()
        negated, kind = word.startswith("!"), word.lstrip("!")
        if kind in NO_ARGUMENT:
            out.append((kind, negated, None))
            i += 1
        else:
            out.append((kind, negated, words[i + 1] if i + 1 < len(words) else None))
            i += 2
    return out


EVALUATED_ONCE = "brctl-evaluated-once"  # a Match criterion no ssh has: defer_matches defers it


def tests_settable(condition: str) -> bool:
    """Whether Match criteria ``condition`` test what a config line may set: ``host``
    (HostName) or ``user`` (User). OpenSSH evaluates a Match once, where it stands;
    one written again further down (``ssh_config._with_includes``) is evaluated there
    again by paramiko, maybe after such a line: the copy must carry ``EVALUATED_ONCE``."""
    try:
        return any(kind in ("host", "user") for kind, _, _ in _criteria(config_args(condition)))
    except ValueError:  # made from words already read: cannot happen; be safe anyway
        return True


def defer_matches(text: str, source: str) -> tuple[str, tuple[DeferredMatch, ...]]:
    """The config text paramiko may evaluate, and the ``Match`` lines it must not.

    Raises:
        SshConfigError: a ``Match`` line that cannot be split into words.
    """
    out: list[str] = []
    deferred: list[DeferredMatch] = []
    pending: DeferredMatch | None = None  # the deferred block being read, until it sets a READ keyword
    for line in text.split("\n"):  # ssh's lines end at a newline only
        try:
            keyword, rest = config_line(line) or ("", "")
        except ValueError as exc:
            raise SshConfigError(f"ssh config {source}: cannot read {line.strip()!r}: {exc}") from None
        if keyword not in ("match", "host"):
            if pending is not None and (keyword in READ or keyword.startswith("canonical")):
                deferred.append(pending)
                pending = None
            out.append(line)
            continue
        pending = None
        if keyword == "host":
            out.append(line)
            continue
        try:
            criteria = _criteria(config_args(rest))
        except ValueError as exc:
            raise SshConfigError(f"ssh config {source}: cannot read {line.strip()!r}: {exc}") from None
        if all(kind in PARAMIKO_CRITERIA for kind, _, _ in criteria):
            out.append(line)
            continue
        hosts = []
        for kind, negated, arg in criteria:
            if kind not in PARAMIKO_CRITERIA:
                break
            if kind in ("host", "originalhost") and arg is not None:
                hosts.append((kind, negated, tuple(p.lower() for p in arg.split(","))))
        pending = DeferredMatch(line.strip(), tuple(hosts))
        out.append(NEVER_MATCHES)  # even when nothing in it counts: paramiko must not run an exec
    return "\n".join(out), tuple(deferred)


def ssh_g(files: Sequence[str], name: str, *, user: str | None, port: int | None,
          timeout: float) -> dict[str, Any]:
    """``ssh -G`` for one host: its effective settings, as paramiko's lookup would give them.

    ``files``: the ``-F`` options that make ssh read the files brctl reads (none:
    ssh's own defaults, the user's file then the system's).
    ``user``/``port``: the inventory's explicit values (passed as ``-l``/``-p``,
    so ``Match user`` sees them, as on ssh's command line). Defaults that ``ssh
    -G`` always prints are dropped where brctl's own defaults differ: a ``user``
    equal to the local user name (brctl's default is ``root``), identity files
    that do not exist (ssh skips them too).

    Raises:
        SshConfigError: no ``ssh`` client, or it rejected the config or timed out.
    """
    exe = shutil.which("ssh")
    why = f"host {name}: its ssh config needs OpenSSH's own evaluation (ssh -G)"
    if exe is None:
        raise SshConfigError(f"{why}, and no ssh client is installed")
    argv = [exe, "-G", *files]
    if user:
        argv += ["-l", user]
    if port:
        argv += ["-p", str(port)]
    try:
        done = subprocess.run([*argv, "--", name], capture_output=True, text=True, errors="replace",
                              stdin=subprocess.DEVNULL, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise SshConfigError(f"{why}, which did not finish within {timeout:g}s") from None
    except OSError as exc:
        raise SshConfigError(f"{why}, which could not run: {exc.strerror}") from None
    if done.returncode != 0:
        said = " / ".join(ln.strip() for ln in done.stderr.splitlines() if ln.strip())[:300]
        raise SshConfigError(f"{why}, which refused it: {said or f'exit {done.returncode}'}")
    return _printed(done.stdout, name, explicit_user=user)


def _printed(out: str, name: str, *, explicit_user: str | None) -> dict[str, Any]:
    """``ssh -G``'s output ``out`` as paramiko's lookup would give it (``ssh_g``), expanded
    where ssh expands only when it connects."""
    cfg: dict[str, Any] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        if key in MULTI_VALUED:
            cfg.setdefault(key, []).append(value)
        elif key and key not in cfg:
            cfg[key] = value
    for key in TOKENISED:
        if key in cfg:
            cfg[key] = expand_path(cfg[key], cfg, name)
    if "proxycommand" in cfg:
        cfg["proxycommand"] = proxy_command(cfg["proxycommand"], cfg, name)
    if cfg.get("user") == getpass.getuser() and not explicit_user:
        del cfg["user"]
    found = [p for p in cfg.get("identityfile", []) if os.path.exists(p)]
    cfg.pop("identityfile", None)
    if found:
        cfg["identityfile"] = found
    return cfg


_TOKEN = re.compile(r"%(.?)", re.DOTALL)
_TOKEN_OR_VARIABLE = re.compile(r"%(.?)|\$\{([^}]*)(\}?)", re.DOTALL)


def expand(value: Any, cfg: Mapping[str, Any], name: str, *, environment: bool = False,
           only: str | None = None) -> Any:
    """``value`` (a string or a list of them) with ssh's %-tokens replaced, and with
    ``environment`` its ``${VAR}`` too (the settings ssh_config(5) says take them);
    ``only``: the tokens the setting takes (``PROXY_TOKENS``), None: all those brctl knows.

    One pass, as OpenSSH's ``percent_dollar_expand``: what a variable or a token gives
    (a ``%`` in ``${VAR}``, the ``%`` of ``%%``) is not read again.

    Raises:
        SshConfigError: what ssh refuses too: a token brctl does not know or the setting does
            not take, a ``%`` at the end, an unset variable, ``${`` unclosed or empty (the host
            and the setting named).
    """
    if isinstance(value, list):
        return [expand(v, cfg, name, environment=environment, only=only) for v in value]
    text = str(value)
    if "%" not in text and not (environment and "$" in text):
        return text  # most values: no hostname, user or hash worked out for nothing
    home = os.path.expanduser("~")
    local = socket.gethostname()
    host, port = str(cfg.get("hostname", name)), str(cfg.get("port", "22"))
    user = str(cfg.get("user", getpass.getuser()))
    tokens = {"%": "%", "h": host, "n": name, "p": port, "r": user, "u": getpass.getuser(), "d": home,
              "l": local, "L": local.split(".")[0], "i": str(os.getuid()),
              "k": str(cfg.get("hostkeyalias") or name),  # OpenSSH 9.2: the alias, else the name given
              "C": hashlib.sha1((local + host + port + user).encode(), usedforsecurity=False).hexdigest()}

    def refused(why: str) -> SshConfigError:
        return SshConfigError(f"host {name}: ssh config value {text!r}: {why}")

    def one(match: re.Match[str]) -> str:
        token = match.group(1)
        if token is None:  # ${VAR}
            variable, closed = match.group(2, 3)
            if not closed:
                raise refused(f"'${{{variable}' has no closing '}}'")
            if not variable:
                raise refused("empty '${}'")
            if variable not in os.environ:
                raise refused(f"environment variable {variable} is not set")
            return os.environ[variable]
        if not token:
            raise refused("'%' at the end")
        if only is not None and token not in only:
            raise refused(f"token %{token} is not one ssh takes in it")
        if token not in tokens:
            raise refused(f"token %{token} is not supported by brctl")
        return tokens[token]

    return (_TOKEN_OR_VARIABLE if environment else _TOKEN).sub(one, text)


def proxy_command(value: Any, cfg: Mapping[str, Any], name: str) -> str:
    """ProxyCommand ``value`` as ssh hands it to the user's shell when it connects: its
    %-tokens (``PROXY_TOKENS``) replaced in one pass; ``~``, ``$VAR``, quotes are the shell's.

    Raises:
        SshConfigError: as ``expand``; a token other than ``PROXY_TOKENS`` too.
    """
    return str(expand(str(value), cfg, name, only=PROXY_TOKENS))


def expand_path(value: Any, cfg: Mapping[str, Any], name: str) -> Any:
    """A file setting (``PATHS``; a string or a list of them) as ssh reads it when it
    connects: a leading ``~`` first, then ``${VAR}`` and %-tokens (``expand``).

    Raises:
        SshConfigError: as ``expand``.
    """
    if isinstance(value, list):
        return [expand_path(v, cfg, name) for v in value]
    return expand(os.path.expanduser(str(value)), cfg, name, environment=True)


def _own_agent(value: str) -> bool:
    """Whether IdentityAgent ``value`` (expanded) is ``none`` or the agent brctl uses anyway,
    ``$SSH_AUTH_SOCK``'s (``IdentityAgent ${SSH_AUTH_SOCK}`` or ``$SSH_AUTH_SOCK`` is ssh's too)."""
    own = ("$SSH_AUTH_SOCK", os.environ.get("SSH_AUTH_SOCK"))
    return value.lower() in ("none", "ssh_auth_sock") or value in own


def unsupported(cfg: Mapping[str, Any]) -> str | None:
    """The first effective setting brctl cannot honour, as ``Keyword value``; None when all can be."""
    checks = (
        ("identityagent", "IdentityAgent", lambda v: not _own_agent(v)),
        ("knownhostscommand", "KnownHostsCommand", lambda v: v.lower() != "none"),
        ("pkcs11provider", "PKCS11Provider", lambda v: v.lower() != "none"),
        ("bindaddress", "BindAddress", lambda v: True),
        ("bindinterface", "BindInterface", lambda v: True),
        ("proxyusefdpass", "ProxyUseFdpass", lambda v: v.lower() in ("yes", "true")),
    )
    for key, keyword, bad in checks:
        value = cfg.get(key)
        if value is not None and bad(str(value)):
            return f"{keyword} {value}"
    return None


def expanded(cfg: Mapping[str, Any], name: str, *, user: str | None, port: int | None) -> dict[str, Any]:
    """paramiko's lookup with the settings ssh expands (``PATHS`` and ProxyCommand, left as
    written: ``Config``) expanded as ssh does, the inventory's explicit user and port applying
    to ``%r``/``%p``; UserKnownHostsFile word by word.

    Raises:
        SshConfigError: an unset variable or a token brctl does not know (ssh refuses those too).
    """
    view = {**cfg, **({"user": user} if user else {}), **({"port": str(port)} if port else {})}
    out = dict(cfg)
    for key in PATHS:
        if key == "userknownhostsfile" and key in cfg:
            out[key] = " ".join(expand_path(str(cfg[key]).split(), view, name))
        elif key in cfg:
            out[key] = expand_path(cfg[key], view, name)
    if cfg.get("proxycommand") is not None:  # None: ``ProxyCommand none``
        out["proxycommand"] = proxy_command(cfg["proxycommand"], view, name)
    return out


CERTIFICATE_LINE = "brctlcertificatefile"  # and a number: one CertificateFile line (``Config``)


@functools.cache
def lines_kept_apart() -> bool:
    """Whether paramiko gives back a keyword it does not know under its own name, its value
    as written, each line apart, as ``Config`` needs to collect CertificateFile."""
    probe = f"Host a\n  {CERTIFICATE_LINE}1 1\nHost *\n  {CERTIFICATE_LINE}0 0\n  {CERTIFICATE_LINE}1 2\n"
    try:
        got = dict(paramiko.SSHConfig.from_text(probe).lookup("a"))
    except Exception:  # whatever a changed paramiko does: not as needed
        return False
    return {k: v for k, v in got.items() if k.startswith(CERTIFICATE_LINE)} == {
        f"{CERTIFICATE_LINE}1": "1", f"{CERTIFICATE_LINE}0": "0"}


class Config(paramiko.SSHConfig):
    """paramiko's ``SSHConfig``, leaving IdentityFile and ProxyCommand as written: paramiko
    replaces their tokens one after the other (``%%h`` became ``%`` and the host name, and that
    ``%r…`` the user), a ``~`` anywhere in them, and not ``${VAR}``/``%n``; ``expanded`` expands
    them as ssh does. And collecting every CertificateFile that applies, as ssh does (paramiko
    keeps the first): each such line is given to paramiko as a keyword of its own
    (``CERTIFICATE_LINE`` and its number: the first value of each applies), read back in file
    order by ``lookup``. A paramiko that stops giving back such keywords as they were written
    (``lines_kept_apart``) is left to read CertificateFile its own way: the first only.
    """

    def __init__(self) -> None:
        super().__init__()
        self.TOKENS_BY_CONFIG_KEY = {k: v for k, v in self.TOKENS_BY_CONFIG_KEY.items()
                                     if k not in (*PATHS, "proxycommand")}
        self._certificates: list[str] = []  # CertificateFile arguments, by line number

    def parse(self, file_obj: Iterable[str]) -> None:
        super().parse([self._certificate(line) for line in file_obj] if lines_kept_apart() else file_obj)

    def _certificate(self, line: str) -> str:
        """``line``, or for a CertificateFile line the ``CERTIFICATE_LINE`` that stands for it.

        Raises:
            paramiko.ConfigParseError: a CertificateFile line with more than one path (ssh refuses it).
        """
        try:
            keyword, rest = config_line(line) or ("", "")
            if keyword != "certificatefile":
                return line
            args = config_args(rest)
        except ValueError:  # brctl read every line already (``_read_line``): cannot happen
            return line  # paramiko reads it its own way
        if len(args) != 1:
            raise paramiko.ConfigParseError(
                f"cannot read {line.strip()!r}: keyword certificatefile extra arguments at end of line")
        self._certificates.append(args[0])
        return f"{CERTIFICATE_LINE}{len(self._certificates) - 1} 0"

    def lookup(self, hostname: str) -> paramiko.SSHConfigDict:
        options = super().lookup(hostname)
        lines = sorted(int(k[len(CERTIFICATE_LINE):]) for k in options if k.startswith(CERTIFICATE_LINE))
        for number in lines:
            del options[f"{CERTIFICATE_LINE}{number}"]
        files = list(dict.fromkeys(self._certificates[number] for number in lines))  # each once, as ssh
        if files:
            options["certificatefile"] = files  # type: ignore[assignment]  # a list, as paramiko's identityfile
        return options
