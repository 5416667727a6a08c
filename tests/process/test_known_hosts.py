"""known_hosts parsing, indexing and checking (no sockets), and ssh config resolution."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from brctl.remote.ssh import known_hosts
from brctl.remote.ssh.known_hosts import (
    HostKeyStatus,
    KnownHostsCache,
    KnownHostsError,
    fingerprint,
    parse,
)
from tests.kits.waiting import PATIENCE, deadline, scaled, wait_event, wait_for


def _blob(keytype: str, payload: bytes) -> bytes:
    t = keytype.encode()
    return len(t).to_bytes(4, "big") + t + len(payload).to_bytes(4, "big") + payload


def _line(hosts: str, payload: bytes, keytype: str = "ssh-ed25519", marker: str = "") -> str:
    b64 = base64.b64encode(_blob(keytype, payload)).decode()
    return f"{marker + ' ' if marker else ''}{hosts} {keytype} {b64} comment"


def _hashed(host: str, salt: bytes = b"0123456789abcdefghij") -> str:
    digest = hmac.new(salt, host.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


K1, K2, K3 = b"a" * 32, b"b" * 32, b"c" * 32
ED = "ssh-ed25519"


def test_plain_port_and_comma_lists() -> None:
    kh = parse(
        "\n".join(
            [
                "# comment",
                "",
                _line("gpu001,10.0.0.1", K1),
                _line("[gpu002]:2222,[10.0.0.2]:2222", K2),
            ]
        ),
        "kh",
    )
    assert kh.check("gpu001", 22, ED, _blob(ED, K1)) is HostKeyStatus.KNOWN
    assert kh.check("10.0.0.1", 22, ED, _blob(ED, K1)) is HostKeyStatus.KNOWN
    assert kh.check("GPU001", 22, ED, _blob(ED, K1)) is HostKeyStatus.KNOWN  # case-insensitive
    assert kh.check("10.0.0.2", 2222, ED, _blob(ED, K2)) is HostKeyStatus.KNOWN
    # [host]:port entries do not match port 22 and vice versa.
    assert kh.check("10.0.0.2", 22, ED, _blob(ED, K2)) is HostKeyStatus.UNKNOWN
    assert kh.check("gpu001", 2222, ED, _blob(ED, K1)) is HostKeyStatus.UNKNOWN
    assert kh.check("gpu001", 22, ED, _blob(ED, K2)) is HostKeyStatus.CHANGED


def test_hashed_entries() -> None:
    kh = parse(_line(_hashed("[10.0.0.9]:2222"), K1) + "\n" + _line(_hashed("gpu009"), K2), "kh")
    assert kh.check("10.0.0.9", 2222, ED, _blob(ED, K1)) is HostKeyStatus.KNOWN
    assert kh.check("gpu009", 22, ED, _blob(ED, K2)) is HostKeyStatus.KNOWN
    assert kh.check("gpu009", 22, ED, _blob(ED, K1)) is HostKeyStatus.CHANGED
    assert kh.check("gpu010", 22, ED, _blob(ED, K2)) is HostKeyStatus.UNKNOWN


def test_wildcards_and_negation() -> None:
    kh = parse(_line("gpu*,!gpu666", K1), "kh")
    assert kh.check("gpu123", 22, ED, _blob(ED, K1)) is HostKeyStatus.KNOWN
    assert kh.check("gpu666", 22, ED, _blob(ED, K1)) is HostKeyStatus.UNKNOWN


def test_revoked_refuses_and_cert_authority_is_skipped() -> None:
    kh = parse(
        "\n".join(
            [
                _line("gpu001", K1),
                _line("*", K1, marker="@revoked"),
                _line("*.cluster", K3, marker="@cert-authority"),
            ]
        ),
        "kh",
    )
    assert kh.check("gpu001", 22, ED, _blob(ED, K1)) is HostKeyStatus.REVOKED
    assert kh.cert_authorities == 1
    assert kh.check("n1.cluster", 22, ED, _blob(ED, K3)) is HostKeyStatus.UNKNOWN


def test_keytypes_for_lists_known_types() -> None:
    kh = parse(_line("h", K1) + "\n" + _line("h", K2, keytype="ssh-rsa"), "kh")
    assert kh.keytypes_for("h", 22) == ["ssh-ed25519", "ssh-rsa"]


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("gpu001 ssh-ed25519", "expected 'hosts keytype base64-key"),
        ("gpu001 ssh-ed25519 !!!notbase64", "not valid base64"),
        (_line("gpu001", K1).replace("ssh-ed25519 ", "ssh-rsa ", 1), "does not match the key"),
        ("@bogus " + _line("gpu001", K1), "unknown marker"),
        (_line("|1|abc", K1), "malformed hashed host"),
        # OpenSSH takes a hashed field whole: "node1" after its comma names no host
        (_line(_hashed("node2") + ",node1", K1), "hashed host"),
    ],
)
def test_malformed_lines_name_file_and_line(line: str, what: str) -> None:
    with pytest.raises(KnownHostsError) as exc:
        parse("# first\n" + line + "\n", "/etc/kh")
    assert exc.value.message.startswith("/etc/kh:2: ")
    assert what in exc.value.message


def test_cache_parses_once_and_rereads_on_change(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(_line("gpu001", K1) + "\n")
    cache = KnownHostsCache()
    first = cache.load_all([str(path), str(path) + ".brctl-accepted"])
    assert cache.load_all([str(path), str(path) + ".brctl-accepted"]) is first
    cache.accept(str(path) + ".brctl-accepted", "[10.0.0.5]:2222", ED, _blob(ED, K2))
    again = cache.load_all([str(path), str(path) + ".brctl-accepted"])
    assert again is not first
    assert again.check("10.0.0.5", 2222, ED, _blob(ED, K2)) is HostKeyStatus.KNOWN
    assert oct(os.stat(str(path) + ".brctl-accepted").st_mode & 0o777) == "0o600"
    fresh = tmp_path / "home" / ".ssh" / "known_hosts.brctl-accepted"
    cache.accept(str(fresh), "gpu001", ED, _blob(ED, K2))
    assert oct(os.stat(fresh.parent).st_mode & 0o777) == "0o700"  # ~/.ssh as OpenSSH makes it


def _count_parses(monkeypatch: pytest.MonkeyPatch,
                  meanwhile: Callable[[], None] = lambda: None) -> list[str]:
    """Each parse of a whole file (not of one accepted line) appends the thread's name;
    ``meanwhile`` runs inside it, with the file read and its parse not yet cached."""
    parses: list[str] = []

    def counted(text: str, source: str) -> Any:
        if text.count("\n") > 1:
            parses.append(threading.current_thread().name)
            meanwhile()
        return parse(text, source)

    monkeypatch.setattr(known_hosts, "parse", counted)
    return parses


def _in_thread(name: str, call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """``call()`` started in a thread named ``name``; the dict gets its result or error."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # re-raised by _joined in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, box


def _joined(thread: threading.Thread, box: dict[str, Any]) -> Any:
    thread.join(scaled(PATIENCE))
    assert not thread.is_alive(), f"thread {thread.name} still running"
    if "error" in box:
        raise box["error"]
    return box["result"]


class _WatchedLock:
    """The cache's ``_lock``, telling the test which threads found it taken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.found_taken: dict[str, threading.Event] = {}

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            self.found_taken.setdefault(threading.current_thread().name, threading.Event()).set()
            self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class _PausedStore(dict[str, Any]):
    """The cache's ``_files``: a store from thread ``who`` (an accept, its line written)
    sets ``stored`` and waits for ``resume`` before it is made."""

    def __init__(self, who: str) -> None:
        super().__init__()
        self.who, self.stored, self.resume = who, threading.Event(), threading.Event()

    def __setitem__(self, key: str, value: Any) -> None:
        if threading.current_thread().name == self.who:
            self.stored.set()
            wait_event(self.resume, "the test to let the accept cache its new stamp")
        super().__setitem__(key, value)


def _hosts(n: int) -> str:
    return "".join(_line(f"gpu{i:03d}", bytes([i]) * 32) + "\n" for i in range(n))


def test_a_load_between_an_accepts_write_and_its_cache_update_parses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fan-out's second parse: a connect found the cache newer than its own stat and
    stat'ed the file again, with no lock, just after a second accept wrote its line and
    before that accept cached the new stamp: a miss, and the whole file parsed again. The
    accept is held between its write and its cache update until the connect has stat'ed
    (or found that it must wait for the accept): the connect uses a cached parse."""
    path = tmp_path / "known_hosts"
    path.write_text(_hosts(20))
    full = str(path)
    parses = _count_parses(monkeypatch)
    cache = KnownHostsCache()
    watched, store = _WatchedLock(), _PausedStore("accept")
    monkeypatch.setattr(cache, "_lock", watched)
    monkeypatch.setattr(cache, "_files", store)
    assert cache.load(full).check("gpu001", 22, ED, _blob(ED, bytes([1]) * 32)) is HostKeyStatus.KNOWN

    stamp = cache._stamp
    stat_ed, go_on, again, restat_ed = (threading.Event() for _ in range(4))
    stuck = threading.Event()  # the accept has written its line, or waits for the connect

    def connects_stamp(full: str) -> Any:
        if threading.current_thread().name != "connect":
            return stamp(full)
        if not stat_ed.is_set():  # load's own stat, before the first accept below
            got = stamp(full)
            stat_ed.set()
            wait_event(go_on, "the first accept")
            return got
        again.set()  # the cache is newer than that stat: stat'ed again
        wait_event(stuck, "the second accept to write its line or find the lock taken")
        got = stamp(full)
        restat_ed.set()
        return got

    monkeypatch.setattr(cache, "_stamp", connects_stamp)
    connect = _in_thread("connect", lambda: cache.load(full))
    wait_event(stat_ed, "the connect's stat")
    assert cache.accept(full, "new1", ED, _blob(ED, K2))
    go_on.set()
    wait_event(again, "the connect to stat the file again")
    accept = _in_thread("accept", lambda: cache.accept(full, "new2", ED, _blob(ED, K3)))
    # Either the accept wrote and waits to cache (and so holds the lock), or it found the
    # lock taken by the connect: the connect's stat comes next, in that window.
    found_taken = watched.found_taken.setdefault("accept", threading.Event())
    wait_for(lambda: store.stored.is_set() or found_taken.is_set(),
             "the second accept to write its line or find the lock taken")
    stuck.set()
    wait_event(restat_ed, "the connect's second stat")
    store.resume.set()
    seen = _joined(*connect)
    assert _joined(*accept) is True
    assert parses == ["MainThread"]  # the first load's, and none since
    assert seen.check("new1", 22, ED, _blob(ED, K2)) is HostKeyStatus.KNOWN
    assert cache.load(full).check("new2", 22, ED, _blob(ED, K3)) is HostKeyStatus.KNOWN
    assert parses == ["MainThread"]


def test_a_parse_of_an_older_version_never_replaces_what_an_accept_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connect reads the file (changed by another process), and while it parses, an
    accept adds a line and caches the file as it now stands. The connect's parse, of the
    version before, must not replace that: every later use would miss and parse again."""
    path = tmp_path / "known_hosts"
    path.write_text(_hosts(20))
    full = str(path)
    reading, accepted = threading.Event(), threading.Event()

    def meanwhile() -> None:
        if threading.current_thread().name == "connect":
            reading.set()
            wait_event(accepted, "the accept")

    parses = _count_parses(monkeypatch, meanwhile)
    cache = KnownHostsCache()
    cache.load(full)
    with path.open("a") as fh:  # another process's change: the cached parse is stale
        fh.write(_line("gpu100", K1) + "\n")
    connect = _in_thread("connect", lambda: cache.load(full))
    wait_event(reading, "the connect's parse")
    assert cache.accept(full, "new1", ED, _blob(ED, K2))  # parses the file itself: stale
    accepted.set()
    assert _joined(*connect).check("gpu100", 22, ED, _blob(ED, K1)) is HostKeyStatus.KNOWN
    assert parses == ["MainThread", "connect", "MainThread"]
    assert cache.load(full).check("new1", 22, ED, _blob(ED, K2)) is HostKeyStatus.KNOWN
    assert cache.accept(full, "new2", ED, _blob(ED, K3))
    assert parses == ["MainThread", "connect", "MainThread"]  # the accept's parse was kept


def test_a_fan_out_parses_a_file_once_and_not_again_for_each_key_it_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every connect of a fan-out asks at once: one parse, not one per thread (a shard
    worker starts cold); and an accepted key is added to the parsed file, not a reason for
    every connect still in flight to parse it all again (64 new hosts, 12,000 lines: 108
    parses, 10.8 s). The first parse ends only once all 16 connects have asked for it."""
    path = tmp_path / "known_hosts"
    path.write_text(_hosts(200))
    cache = KnownHostsCache()
    lock, asked = threading.Lock(), threading.Condition()
    askers = 0

    def parse_lock(key: object) -> threading.Lock:  # one file: one lock, counting who asks
        nonlocal askers
        with asked:
            askers += 1
            asked.notify_all()
        return lock

    def until_all_asked() -> None:
        with asked:
            if not asked.wait_for(lambda: askers >= 16, scaled(PATIENCE)):
                raise AssertionError(f"only {askers} of 16 connects asked for the file")

    parses = _count_parses(monkeypatch, until_all_asked)
    monkeypatch.setattr(cache, "_parsing", parse_lock)

    def connect(i: int) -> None:
        seen = cache.load_all([str(path)])
        if i >= 8:  # eight more hosts, new: accept-new adds them
            assert seen.check(f"new{i}", 22, ED, _blob(ED, K3)) is HostKeyStatus.UNKNOWN
            assert cache.accept(str(path), f"new{i}", ED, _blob(ED, K3))
            assert cache.load_all([str(path)]).check(f"new{i}", 22, ED, _blob(ED, K3)) is HostKeyStatus.KNOWN

    threads = [_in_thread(f"connect{i}", lambda i=i: connect(i)) for i in range(16)]  # type: ignore[misc]
    for t in threads:
        _joined(*t)
    assert len(parses) == 1
    assert len(path.read_text().splitlines()) == 208
    assert KnownHostsCache().load(str(path)).check("new15", 22, ED, _blob(ED, K3)) is HostKeyStatus.KNOWN


def test_a_file_replaced_with_its_size_and_time_kept_is_read_again(tmp_path: Path) -> None:
    """A restore, ``cp -p`` or ``rsync -t`` puts the node's new key in place with the old
    file's size and mtime: what was parsed before must not answer for it (the removed key
    trusted, the new one refused as CHANGED)."""
    accepted = tmp_path / "known_hosts.brctl-accepted"
    accepted.write_text(_line("node1", K1) + "\n")
    cache = KnownHostsCache()
    assert cache.load_all([str(accepted)]).check("node1", 22, ED, _blob(ED, K1)) is HostKeyStatus.KNOWN
    st = accepted.stat()
    replacement = tmp_path / "restored"
    replacement.write_text(_line("node1", K2) + "\n")
    os.utime(replacement, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.rename(replacement, accepted)
    assert accepted.stat().st_size == st.st_size and accepted.stat().st_mtime_ns == st.st_mtime_ns
    assert cache.accept(str(accepted), "node1", ED, _blob(ED, K1)) is False
    assert cache.accept(str(accepted), "node1", ED, _blob(ED, K2)) is True
    assert cache.load_all([str(accepted)]).check("node1", 22, ED, _blob(ED, K1)) is HostKeyStatus.CHANGED


def test_hashed_revoked_is_refused_like_a_plain_one() -> None:
    hashed = _hashed("[10.0.0.9]:2222")
    kh = parse(f"{_line('[10.0.0.9]:2222', K1)}\n{_line(hashed, K1, marker='@revoked')}\n", "kh")
    assert kh.check("10.0.0.9", 2222, ED, _blob(ED, K1)) is HostKeyStatus.REVOKED
    assert kh.check("10.0.0.8", 2222, ED, _blob(ED, K1)) is HostKeyStatus.UNKNOWN


def test_cert_authority_is_found_for_the_hosts_it_covers() -> None:
    kh = parse(_line("*.example.com", K1, marker="@cert-authority") + "\n", "kh")
    assert kh.has_authority(["gpu1.example.com"]) == "kh:1"
    assert kh.has_authority(["gpu1.other.com"]) is None
    ported = parse(_line("[10.0.0.*]:*", K1, marker="@cert-authority") + "\n", "kh")
    assert ported.has_authority(["[10.0.0.3]:2222"]) == "kh:1"  # '[' is literal, as in OpenSSH
    assert ported.has_authority(["10.0.0.3"]) is None


def test_12k_entries_load_fast(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(
        "\n".join(_line(f"gpu{i:05d},10.1.{i // 250}.{i % 250}", i.to_bytes(32, "big")) for i in range(12000))
    )
    with deadline(5, "loading 12,000 lines (~0.1 s of CPU; paramiko's HostKeys.load: ~18 s)",
                  clock=time.process_time):
        kh = KnownHostsCache().load(str(path))
    assert kh.check("gpu11999", 22, ED, _blob(ED, (11999).to_bytes(32, "big"))) is HostKeyStatus.KNOWN


def test_fingerprint_is_openssh_format() -> None:
    assert fingerprint(b"x").startswith("SHA256:") and not fingerprint(b"x").endswith("=")


# -- ssh config resolution (SshTransport.endpoint; no connection is made) --------------


def test_ssh_config_fills_only_what_the_inventory_leaves_default(tmp_path: Path) -> None:
    from brctl.core.transport import Node
    from brctl.remote.ssh.transport import SshTransport

    cfg = tmp_path / "config"
    cfg.write_text(
        "Host gpu*\n  HostName %h.example\n  User ops\n  Port 2200\n  IdentityFile ~/.ssh/fleet\n"
        "  ProxyJump bastion\n"
        "Host bastion\n  HostName 10.9.9.9\n  Port 2022\n  User jumper\n"
    )
    t = SshTransport(ssh_config=str(cfg))
    ep = t.endpoint(Node(name="gpu001", address="gpu001"))
    assert (ep.host, ep.user, ep.port) == ("gpu001.example", "ops", 2200)
    assert ep.identities == (os.path.expanduser("~/.ssh/fleet"),)
    assert ep.jump is not None
    assert (ep.jump.host, ep.jump.port, ep.jump.user) == ("10.9.9.9", 2022, "jumper")
    # Explicit inventory values win.
    ep = t.endpoint(
        Node(name="gpu002", address="10.0.0.2", user="svc", port=2222, identity_file="/k",
             proxy_jump="me@hop:2023")
    )  # fmt: skip
    assert (ep.host, ep.user, ep.port, ep.identities) == ("10.0.0.2", "svc", 2222, ("/k",))
    assert ep.jump is not None and (ep.jump.host, ep.jump.user, ep.jump.port) == ("hop", "me", 2023)
    # No config at all: the user's and the global files; the accept-new file only under accept-new.
    plain = SshTransport(ssh_config=os.devnull).endpoint(Node(name="gpu001", address="gpu001"))
    assert (plain.host, plain.user, plain.port, plain.jump) == ("gpu001", "root", 22, None)
    assert plain.known_hosts == (os.path.expanduser("~/.ssh/known_hosts"),
                                 os.path.expanduser("~/.ssh/known_hosts2"), "/etc/ssh/ssh_known_hosts",
                                 "/etc/ssh/ssh_known_hosts2")
    assert plain.accepted is None and plain.key_names == ("gpu001",)
    new = SshTransport(ssh_config=os.devnull).endpoint(
        Node(name="gpu001", address="gpu001", host_key_policy="accept-new"))
    assert new.accepted == new.known_hosts[-1] == os.path.expanduser("~/.ssh/known_hosts.brctl-accepted")


def test_known_hosts_files_and_alias_come_from_ssh_config(tmp_path: Path) -> None:
    from brctl.core.transport import Node
    from brctl.remote.ssh.transport import SshTransport

    cfg = tmp_path / "config"
    cfg.write_text("Host gpu*\n  UserKnownHostsFile /u1 /u2\n  GlobalKnownHostsFile /g1\n"
                   "  HostKeyAlias fleet-gpu\n")
    ep = SshTransport(ssh_config=str(cfg)).endpoint(Node(name="gpu7", address="gpu7", port=2222))
    assert (ep.known_hosts, ep.key_names) == (("/u1", "/u2", "/g1"), ("fleet-gpu",))
    mine = SshTransport(ssh_config=str(cfg)).endpoint(Node(name="gpu7", address="gpu7", known_hosts="/mine"))
    assert mine.known_hosts == ("/mine", "/g1")  # the inventory's explicit file wins


def test_multi_hop_proxy_jump_is_a_chain(tmp_path: Path) -> None:
    from brctl.core.transport import Node
    from brctl.remote.ssh.transport import SshTransport

    t = SshTransport(ssh_config=os.devnull)
    ep = t.endpoint(Node(name="n", address="n", proxy_jump="u1@a:2201,b"))
    assert ep.jump is not None and (ep.jump.host, ep.jump.port) == ("b", 22)
    assert ep.jump.jump is not None and (ep.jump.jump.host, ep.jump.jump.port, ep.jump.jump.user) == (
        "a", 2201, "u1")
    assert ep.jump.jump.jump is None


def test_passphrase_protected_key_is_auth_without_prompt(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from brctl.core.transport import NodeState
    from brctl.remote.ssh.connect import ConnectError, Connector

    path = tmp_path / "locked"
    path.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.BestAvailableEncryption(b"s3cret-passphrase"),
        )
    )
    connector = Connector(connect_rate=100.0, connect_retries=0, keepalive=0)
    with pytest.raises(ConnectError) as exc:
        connector.pkey(str(path))
    assert exc.value.state is NodeState.AUTH
    assert "passphrase-protected" in exc.value.message and "s3cret" not in exc.value.message
    with pytest.raises(ConnectError, match="not found"):
        connector.pkey(str(tmp_path / "missing"))


def test_rate_limiter_caps_new_connections_per_second(monkeypatch: pytest.MonkeyPatch) -> None:
    from brctl.remote.ssh import connect as ssh_connect
    from brctl.remote.ssh.connect import RateLimiter

    class Clock:  # time as the limiter sees it: it moves only when the limiter sleeps
        now = 0.0

        def monotonic(self) -> float:
            return self.now

        def sleep(self, seconds: float) -> None:
            self.now += seconds + 1e-6  # as a real sleep, a little over (and never zero)

    clock = Clock()
    monkeypatch.setattr(ssh_connect, "time", clock)
    limiter = RateLimiter(20.0, burst=1)
    for _ in range(6):
        limiter.acquire()
    assert clock.now == pytest.approx(5 / 20, abs=1e-3)  # the first is free, 5 more at 20/s


def test_malformed_known_hosts_fails_preload_with_file_and_line(tmp_path: Path) -> None:
    from brctl.core.errors import InputError
    from brctl.core.transport import Node
    from brctl.remote.ssh.transport import SshTransport

    kh = tmp_path / "known_hosts"
    kh.write_text(_line("ok", K1) + "\ngarbage-line\n")
    with pytest.raises(InputError, match=f"{kh}:2: "):
        SshTransport(ssh_config=os.devnull).preload([Node(name="n", address="n", known_hosts=str(kh))])


def test_worker_processes_only_for_large_fanouts() -> None:
    from brctl.remote.shard import MIN_NODES_PER_PROCESS, worth_processes

    assert worth_processes(8, 64) == 1
    assert worth_processes(8, 2 * MIN_NODES_PER_PROCESS) == 2
    assert worth_processes(2, 10_000) == 2


def test_a_negated_pattern_vetoes_the_whole_line_as_openssh() -> None:
    """``ssh-keygen -F node1`` finds nothing for ``node1,!node1`` (or ``node7,!node*``): a
    negated match vetoes the line even where another pattern of it names the host exactly."""
    kh = parse("\n".join([_line("node1,!node1", K1), _line("node7,gpu1,!node*", K2)]), "kh")
    assert kh.check("node1", 22, ED, _blob(ED, K1)) is HostKeyStatus.UNKNOWN
    assert kh.check("node7", 22, ED, _blob(ED, K2)) is HostKeyStatus.UNKNOWN
    assert kh.check("gpu1", 22, ED, _blob(ED, K2)) is HostKeyStatus.KNOWN
    revoked = parse("\n".join([_line("node1", K1), _line("node1,!node1", K1, marker="@revoked")]), "kh")
    assert revoked.check("node1", 22, ED, _blob(ED, K1)) is HostKeyStatus.KNOWN


def test_only_newline_ends_a_line_as_openssh() -> None:
    """OpenSSH splits lines on ``\\n`` only: a comment holding ``\\x1c`` or U+2028 (which
    ``str.splitlines`` treats as line ends) stays a comment; CRLF still works."""
    text = f"# c\x1c{_line('node2', K1)}\n# d\u2028{_line('node3', K1)}\r\n{_line('node4', K2)}\r\n"
    kh = parse(text, "kh")
    assert kh.check("node2", 22, ED, _blob(ED, K1)) is HostKeyStatus.UNKNOWN
    assert kh.check("node3", 22, ED, _blob(ED, K1)) is HostKeyStatus.UNKNOWN
    assert kh.check("node4", 22, ED, _blob(ED, K2)) is HostKeyStatus.KNOWN


def test_user_known_hosts_files_are_expanded_as_ssh_g(tmp_path: Path) -> None:
    """paramiko leaves UserKnownHostsFile as written; ssh expands ``~``, %-tokens and
    ``${VAR}`` in it, so brctl read a literal ``known_hosts_%h`` that does not exist:
    the host's listed key was unseen, and ``accept-new`` trusted whatever key came."""
    import subprocess

    from brctl.core.transport import Node
    from brctl.remote.ssh.transport import SshTransport

    cfg = tmp_path / "config"
    cfg.write_text("Host gpu*\n  HostName %h.fleet\n"
                   "  UserKnownHostsFile ~/.ssh/kh_%h %d/kh_%n_%p ${HOME}/kh_%r\n"
                   "Host none*\n  UserKnownHostsFile none\n")
    ep = SshTransport(ssh_config=str(cfg)).endpoint(Node(name="gpu7", address="gpu7", user="bob", port=2222))
    got = subprocess.run(["ssh", "-G", "-F", str(cfg), "-l", "bob", "-p", "2222", "gpu7"],
                         capture_output=True, text=True, check=True).stdout
    want = next(ln.split()[1:] for ln in got.splitlines() if ln.startswith("userknownhostsfile "))
    assert list(ep.known_hosts[:3]) == want
    # ``none``: no user file (not a file named "none" in the current directory).
    ep = SshTransport(ssh_config=str(cfg)).endpoint(Node(name="none1", address="none1"))
    assert ep.known_hosts == ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
    # /dev/null records nothing: accept-new there acts as strict (no /dev/null.brctl-accepted)
    dev = tmp_path / "dev.config"
    dev.write_text("Host *\n  UserKnownHostsFile /dev/null\n")
    ep = SshTransport(ssh_config=str(dev)).endpoint(
        Node(name="gpu7", address="gpu7", host_key_policy="accept-new"))
    assert ep.accepted is None and os.devnull + ".brctl-accepted" not in ep.known_hosts
    # OpenSSH's default user files are known_hosts and known_hosts2.
    ep = SshTransport(ssh_config=os.devnull).endpoint(Node(name="gpu7", address="gpu7"))
    assert ep.known_hosts[:2] == tuple(os.path.expanduser(f"~/.ssh/known_hosts{n}") for n in ("", "2"))


def test_accept_new_rechecks_under_a_lock_what_another_connect_accepted(tmp_path: Path) -> None:
    """Two connects to one host (two users, two brctl processes) both saw it unknown and
    each accepted its own key: both were then trusted. The second now gets False (refused as
    changed) and the file keeps one key."""
    accepted = str(tmp_path / "known_hosts.brctl-accepted")
    first, second = KnownHostsCache(), KnownHostsCache()
    assert first.load_all([accepted]).check("node1", 22, ED, _blob(ED, K1)) is HostKeyStatus.UNKNOWN
    assert second.load_all([accepted]).check("node1", 22, ED, _blob(ED, K2)) is HostKeyStatus.UNKNOWN
    assert second.accept(accepted, "node1", ED, _blob(ED, K2)) is True
    assert first.accept(accepted, "node1", ED, _blob(ED, K1)) is False
    assert first.accept(accepted, "node1", ED, _blob(ED, K2)) is True  # the same key: nothing added
    assert first.load_all([accepted]).check("node1", 22, ED, _blob(ED, K1)) is HostKeyStatus.CHANGED
    assert len(Path(accepted).read_text().splitlines()) == 1


def test_an_unset_variable_in_user_known_hosts_file_is_exit_2_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ssh refuses a ``${VAR}`` that is not set; reading ``${VAR}/kh`` literally would leave
    the host's key unseen (and ``accept-new`` trusting whatever key came)."""
    from brctl.core.errors import ExitCode
    from brctl.core.transport import Node
    from brctl.remote.ssh.openssh import SshConfigError
    from brctl.remote.ssh.transport import SshTransport

    monkeypatch.delenv("BRCTL_TEST_NOT_SET", raising=False)
    cfg = tmp_path / "config"
    cfg.write_text("Host *\n  UserKnownHostsFile ${BRCTL_TEST_NOT_SET}/kh_%h\n")
    with pytest.raises(SshConfigError) as err:
        SshTransport(ssh_config=str(cfg)).endpoint(Node(name="gpu7", address="gpu7"))
    assert err.value.code is ExitCode.USAGE
    assert "gpu7" in err.value.message and "BRCTL_TEST_NOT_SET is not set" in err.value.message
