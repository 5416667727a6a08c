"""OpenSSH ``known_hosts`` files, parsed once and indexed (no paramiko).

paramiko's ``HostKeys.load`` checks every new line against all previous ones, so
a 12,000-line file takes ~18 s. Here a file is parsed once per
(path, mtime, size) into a dict keyed by host pattern: plain hosts, ``[host]:port``
and comma lists are O(1) lookups; hashed entries (``|1|salt|hash``) need one
HMAC-SHA1 per hashed line per looked-up name, so they are checked linearly (and
the answer is cached per name); wildcard patterns (``*``, ``?``, ``!neg``) are
matched linearly too.

What is supported, and what is not:

- ``@revoked`` lines: a revoked key is refused for every host its patterns match,
  plain, wildcard or hashed (they are indexed like the keys).
- ``@cert-authority`` lines are indexed but cannot be used: paramiko cannot verify
  host certificates (its issues #771/#2277), so a host published only through a
  host CA is refused with a message naming that gap (``has_authority``), and is
  never trusted on first use, even under ``accept-new``.
- A malformed line is an ``InputError`` naming ``file:line`` (exit 2), never a
  silent skip: a typo in known_hosts would otherwise look like an unknown host.

``check`` answers one of ``KNOWN``, ``UNKNOWN``, ``CHANGED`` or ``REVOKED``.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import hmac
import os
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from brctl.core.errors import InputError
from brctl.core.locks import KeyedLocks


class KnownHostsError(InputError):
    """A known_hosts file that cannot be read or parsed (names file:line)."""


class HostKeyStatus(str, Enum):
    """Result of checking one server key."""

    KNOWN = "known"
    UNKNOWN = "unknown"
    CHANGED = "changed"
    REVOKED = "revoked"


@dataclass(frozen=True)
class HostKeyEntry:
    """One key line: its key type and the raw key blob."""

    keytype: str
    blob: bytes
    source: str  # "file:line", for messages


def host_names(host: str, port: int) -> list[str]:
    """The names OpenSSH looks up for ``host``: ``host`` on 22, else ``[host]:port``."""
    return [host] if port == 22 else [f"[{host}]:{port}"]


def fingerprint(blob: bytes) -> str:
    """OpenSSH's SHA256 fingerprint of a key blob (``SHA256:...``)."""
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def _blob_type(blob: bytes) -> str:
    """The key type string inside an SSH key blob (first length-prefixed string)."""
    if len(blob) < 4:
        return ""
    n = int.from_bytes(blob[:4], "big")
    return blob[4 : 4 + n].decode("ascii", errors="replace")


@dataclass
class KnownHosts:
    """The parsed contents of one or more known_hosts files."""

    exact: dict[str, list[HostKeyEntry]] = field(default_factory=dict)
    hashed: list[tuple[bytes, bytes, HostKeyEntry]] = field(default_factory=list)
    wildcard: list[tuple[tuple[str, ...], HostKeyEntry]] = field(default_factory=list)
    revoked: KnownHosts | None = None  # @revoked lines, indexed like the keys
    authorities: KnownHosts | None = None  # @cert-authority lines (see the module docstring)
    cert_authorities: int = 0
    _hashed_hits: dict[str, list[HostKeyEntry]] = field(default_factory=dict, repr=False)

    def add(self, patterns: Sequence[str], entry: HostKeyEntry) -> None:
        """Index ``entry`` under each host pattern.

        A line with a negated pattern is matched as a whole (``node1,!node*`` does not
        list node1, as in OpenSSH): none of its patterns goes to the exact index.
        """
        negated = any(p.startswith("!") for p in patterns)
        wild: list[str] = []
        for pattern in patterns:
            if pattern.startswith("|1|"):
                salt, digest = _parse_hashed(pattern, entry.source)
                self.hashed.append((salt, digest, entry))
            elif negated or "*" in pattern or "?" in pattern or "!" in pattern:
                wild.append(pattern)
            else:
                self.exact.setdefault(pattern.lower(), []).append(entry)
        if wild:
            self.wildcard.append((tuple(wild), entry))

    def merge(self, other: KnownHosts) -> None:
        """Add everything of ``other`` (files are independent; order does not matter)."""
        for name, entries in other.exact.items():
            self.exact.setdefault(name, []).extend(entries)
        self.hashed.extend(other.hashed)
        self._hashed_hits.clear()
        self.wildcard.extend(other.wildcard)
        if other.revoked is not None:
            self.revoked = self.revoked or KnownHosts()
            self.revoked.merge(other.revoked)
        if other.authorities is not None:
            self.authorities = self.authorities or KnownHosts()
            self.authorities.merge(other.authorities)
        self.cert_authorities += other.cert_authorities

    def lookup(self, names: Iterable[str]) -> list[HostKeyEntry]:
        """Every key listed for any of ``names`` (plain, hashed or wildcard lines)."""
        found: list[HostKeyEntry] = []
        for name in names:
            low = name.lower()
            found.extend(self.exact.get(low, ()))
            found.extend(self._hashed_lookup(low))
            for patterns, entry in self.wildcard:
                if match_patterns(low, patterns):
                    found.append(entry)
        return found

    def _hashed_lookup(self, name: str) -> list[HostKeyEntry]:
        # One HMAC per hashed line: linear, so remember the answer per name.
        hit = self._hashed_hits.get(name)
        if hit is None:
            key = name.encode()
            hit = [
                entry
                for salt, digest, entry in self.hashed
                if hmac.compare_digest(hmac.new(salt, key, hashlib.sha1).digest(), digest)
            ]
            self._hashed_hits[name] = hit
        return hit

    def is_revoked(self, names: Iterable[str], blob: bytes) -> bool:
        """True when ``blob`` is listed ``@revoked`` for any of ``names``."""
        return self.revoked is not None and any(e.blob == blob for e in self.revoked.lookup(names))

    def has_authority(self, names: Iterable[str]) -> str | None:
        """The ``file:line`` of a ``@cert-authority`` line that covers one of ``names``, if any."""
        found = self.authorities.lookup(names) if self.authorities is not None else []
        return found[0].source if found else None

    def check(
        self, host: str, port: int, keytype: str, blob: bytes, *, names: Sequence[str] = ()
    ) -> HostKeyStatus:
        """Check the key a server presented.

        Args:
            host: the address (or name) connected to, as looked up by OpenSSH.
            port: the port connected to.
            names: the names to look up instead (a ``HostKeyAlias``).
            keytype: the key's type as the server presented it.
            blob: the key's wire blob.

        Returns:
            KNOWN when listed; CHANGED when the host has a key of the same type
            but a different one (or only keys of other types); REVOKED when the
            key is ``@revoked``; UNKNOWN when the host is not listed at all.
        """
        names = names or host_names(host, port)
        if self.is_revoked(names, blob):
            return HostKeyStatus.REVOKED
        entries = self.lookup(names)
        if any(e.blob == blob for e in entries):
            return HostKeyStatus.KNOWN
        if entries:
            return HostKeyStatus.CHANGED
        return HostKeyStatus.UNKNOWN

    def keytypes_for(self, host: str, port: int, *, names: Sequence[str] = ()) -> list[str]:
        """Key types listed for the host, so the client can ask the server for those first."""
        seen: list[str] = []
        for e in self.lookup(names or host_names(host, port)):
            if e.keytype not in seen:
                seen.append(e.keytype)
        return seen


def _glob(pattern: str) -> re.Pattern[str]:
    """OpenSSH's match_pattern: only ``*`` and ``?`` are special (``[host]:port`` is literal)."""
    return re.compile(re.escape(pattern.lower()).replace(r"\*", ".*").replace(r"\?", "."), re.S)


def match_patterns(name: str, patterns: Iterable[str]) -> bool:
    """OpenSSH pattern-list semantics: any positive match and no negated match."""
    positive = False
    for pattern in patterns:
        if pattern.startswith("!"):
            if _glob(pattern[1:]).fullmatch(name):
                return False
        elif _glob(pattern).fullmatch(name):
            positive = True
    return positive


def _parse_hashed(pattern: str, source: str) -> tuple[bytes, bytes]:
    parts = pattern.split("|")
    if len(parts) != 4 or parts[2] == "" or parts[3] == "":
        raise KnownHostsError(f"{source}: malformed hashed host {pattern!r}")
    try:
        return base64.b64decode(parts[2], validate=True), base64.b64decode(parts[3], validate=True)
    except binascii.Error:
        raise KnownHostsError(f"{source}: bad base64 in hashed host {pattern!r}") from None


def parse(text: str, filename: str) -> KnownHosts:
    """Parse a known_hosts file's text.

    Args:
        text: the file contents.
        filename: used in error messages (``file:line``).

    Returns:
        The indexed entries.

    Raises:
        KnownHostsError: a malformed line (names file:line and what is wrong).
    """
    kh = KnownHosts()
    # As OpenSSH: lines end at "\n" only (not at the other ends str.splitlines knows,
    # e.g. \x1c or U+2028 inside a comment), fields are separated by spaces and tabs.
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.strip(" \t\r")
        if not line or line.startswith("#"):
            continue
        source = f"{filename}:{lineno}"
        fields = [f for f in line.replace("\t", " ").split(" ") if f]
        marker = ""
        if fields[0].startswith("@"):
            marker = fields.pop(0)
            if marker not in ("@revoked", "@cert-authority"):
                raise KnownHostsError(f"{source}: unknown marker {marker!r}")
        if len(fields) < 3:
            raise KnownHostsError(
                f"{source}: expected 'hosts keytype base64-key [comment]', got {len(fields)} field(s)"
            )
        hosts, keytype, b64 = fields[0], fields[1], fields[2]
        try:
            blob = base64.b64decode(b64, validate=True)
        except binascii.Error:
            raise KnownHostsError(f"{source}: the key is not valid base64") from None
        if _blob_type(blob) != keytype:
            raise KnownHostsError(
                f"{source}: key type {keytype!r} does not match the key ({_blob_type(blob)!r})"
            )
        entry = HostKeyEntry(keytype, blob, source)
        # A hashed field is one hash, commas and all, as OpenSSH reads it (never a list
        # holding a plain name beside it): a comma in it is malformed.
        patterns = [hosts] if hosts.startswith("|1|") else [p for p in hosts.split(",") if p]
        if not patterns:
            raise KnownHostsError(f"{source}: no host pattern")
        if marker == "@cert-authority":
            kh.cert_authorities += 1
            kh.authorities = kh.authorities or KnownHosts()
            kh.authorities.add(patterns, entry)
        elif marker == "@revoked":
            kh.revoked = kh.revoked or KnownHosts()
            kh.revoked.add(patterns, entry)
        else:
            kh.add(patterns, entry)
    return kh


Stamp = tuple[int, int, int, int, int]


def _stamp_of(st: os.stat_result) -> Stamp:
    """What tells a file's versions apart: a rename (a new inode) or any write (ctime, which
    no one can set back: ``cp -p``, ``rsync -t`` and a restore keep the mtime and the size)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class KnownHostsCache:
    """Parsed files shared by every connection; each file is re-read only when it changes.

    Keyed by path and ``Stamp``. Thread-safe. ``accept`` appends a newly seen
    key to an ``accept-new`` file and updates the cached index.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parsing = KeyedLocks()  # one parse of a file at a time
        self._files: dict[str, tuple[Stamp, KnownHosts]] = {}
        self._merged: dict[tuple[tuple[str, Stamp | None], ...], KnownHosts] = {}

    def _stamp(self, full: str) -> Stamp | None:
        try:
            st = os.stat(full)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise KnownHostsError(f"{full}: cannot read: {exc.strerror}") from None
        return _stamp_of(st)

    def _parse_file(self, full: str, stamp: Stamp | None) -> KnownHosts:
        if stamp is None:
            return KnownHosts()
        with self._parsing(full):  # a fan-out's threads all ask at once: one parses, the others wait
            # Stat'ed under the lock too: an accept writes the file and caches its new stamp
            # under this lock, and a stat between the two would miss and parse it again.
            with self._lock:
                cached = self._files.get(full)
                if cached is not None and (cached[0] == stamp or cached[0] == self._stamp(full)):
                    return cached[1]  # as asked, or newer: an accept cached it meanwhile
            try:
                with open(full, encoding="utf-8", errors="replace") as fh:
                    st = os.fstat(fh.fileno())
                    parsed = parse(fh.read(), full)
            except OSError as exc:
                raise KnownHostsError(f"{full}: cannot read: {exc.strerror}") from None
            read = _stamp_of(st)  # the stamp of what was read, not of what was asked
            with self._lock:
                # Only an accept can have cached this file meanwhile (its parses are one at a
                # time), and it cached the file as it then stood: an older read must not
                # replace that, so this one is kept only if it is the file as it stands.
                if self._files.get(full) is cached or read == self._stamp(full):
                    self._files[full] = (read, parsed)
            return parsed

    def load(self, path: str) -> KnownHosts:
        """The parsed file at ``path`` (empty when it does not exist)."""
        full = os.path.expanduser(path)
        return self._parse_file(full, self._stamp(full))

    def load_all(self, paths: Sequence[str]) -> KnownHosts:
        """The union of several files; cached until one of them changes."""
        fulls = [os.path.expanduser(p) for p in paths]
        key = tuple((f, self._stamp(f)) for f in fulls)
        with self._lock:
            hit = self._merged.get(key)
        if hit is not None:
            return hit
        merged = KnownHosts()
        for full, stamp in key:
            merged.merge(self._parse_file(full, stamp))
        with self._lock:
            # Keep only the newest union per set of files.
            for old in [k for k in self._merged if tuple(f for f, _ in k) == tuple(fulls)]:
                del self._merged[old]
            self._merged[key] = merged
        return merged

    def accept(self, path: str, name: str, keytype: str, blob: bytes) -> bool:
        """Append ``name``'s key to ``path`` (created 0600, its directory 0700) for ``accept-new``.

        Checked again under an exclusive lock on the file itself: a connect that saw
        the host unknown, in this process or another, may have accepted a key since.

        Returns:
            True when ``path`` now lists this key for ``name`` (added, or already there);
            False when it lists another one (refuse it as changed).
        """
        full = os.path.expanduser(path)
        line = f"{name} {keytype} {base64.b64encode(blob).decode()}\n"
        with self._lock:
            os.makedirs(os.path.dirname(full) or ".", mode=0o700, exist_ok=True)
            fd = os.open(full, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                st = os.fstat(fd)
                cached = self._files.get(full)
                if cached is not None and cached[0] == _stamp_of(st):
                    parsed = cached[1]  # nobody wrote it since it was parsed: as it stands
                else:
                    chunks = []
                    while chunk := os.read(fd, 1 << 20):
                        chunks.append(chunk)
                    parsed = parse(b"".join(chunks).decode("utf-8", errors="replace"), full)
                listed = parsed.lookup([name])
                if not listed:
                    os.write(fd, line.encode())
                    grown = KnownHosts()
                    grown.merge(parsed)
                    grown.merge(parse(line, full))
                    parsed = grown
                # What this parse saw is the file as it now stands: cached under its new
                # stamp, so the connects still in flight do not each parse it again.
                st = os.fstat(fd)
                self._files[full] = (_stamp_of(st), parsed)
            finally:
                os.close(fd)  # releases the lock
        return not listed or any(e.blob == blob for e in listed)
