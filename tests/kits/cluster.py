"""A real OpenSSH test cluster on loopback: one sshd per simulated machine.

Every simulated machine is a real ``/usr/sbin/sshd`` listening on its own
``127.0.0.N`` address (node *i* of a cluster gets ``127.0.0.(i+2)``, i.e. the
first node is ``127.0.0.2``) and one high port shared by the cluster's nodes,
with its own ed25519 host key. The cluster writes a ``known_hosts`` for all of
them and a throwaway ed25519 client key. Each sshd runs in its own PID and
mount namespace::

    unshare --pid --mount --fork --kill-child --mount-proc \\
        sh -c '<bind mounts>; exec /usr/sbin/sshd -D -E <log> -f <cfg>'

so a machine sees only its own processes in ``/proc`` and owns private copies
of ``/root/.cache``, ``/root/.local`` and the ``private_dirs`` it was given
(bind mounts of directories under the cluster's tmp dir, so a test can look at
them from outside with ``node_path``). ``/root/.bashrc`` and ``/root/.profile``
are covered by empty files: root's real rc files (pyenv init) would cost
~150 ms of sshd CPU per connection. Logins are as root with the throwaway key;
the node's PATH is sshd's default, so tests name the interpreter they need in
the inventory (``python=sys.executable`` for torch, ``/usr/bin/python3`` for a
bare node).

The module installs nothing. It needs root, ``/usr/sbin/sshd`` and
``unshare``; ``missing_requirements()`` says what is missing so the fixtures can
skip (or fail, when ``BRCTL_REQUIRE_INTEGRATION=1``, as CI sets).

API (fixtures in ``tests/integration/conftest.py``)::

    make_cluster(n, private_dirs=(), prefix="node") -> SshCluster  # factory, stopped after the test
    ssh_cluster                    # session-wide 4 nodes, private /opt/train and /local/ckpt;
                                   # read-only use: don't stop nodes of it, use make_cluster

    cluster.names                  # ["node01", ...]
    cluster.address(name) / cluster.port / cluster.client_key / cluster.known_hosts
    cluster.inventory(names=None, job=None, node_env=None, extra=None, python=None) -> dict
    cluster.write_inventory(tmp_path, **same) -> Path            # YAML file
    cluster.node_path(name, "/opt/train/current") -> Path         # that path as the node sees it
    cluster.stop_node(name) / cluster.start_node(name)            # make a node unreachable
    cluster.freeze_node(name) / cluster.thaw_node(name)           # SIGSTOP it: a hung machine
    cluster.count_connections(name) -> int                        # from its sshd log
    cluster.node_pids(name, pattern) -> list[int]                 # host PIDs in its namespace
    cluster.log(name) -> str
    silent_listener() -> (address, port)   # context manager: accepts TCP, never speaks

Per-node environment: ``cluster.inventory(node_env={"node02": {"PATH": "/x:/usr/bin"}})``
gives node02 that ``env:``; ``extra`` is merged recursively into the dict
(``extra={"ssh": {"connect_timeout": 3}, "update": {"root": "/opt/train"}}``).

Ports: a cluster holds an ``flock`` on ``/tmp/brctl-test-sshd-<port>.lock``
while it lives, so clusters of concurrent test sessions never share a port.
Timeouts in tests are multiplied by ``$BRCTL_TIMEOUT_SCALE`` (``scaled()``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

# One definition of the timeout scale; the cluster's users import it from here too.
from tests.kits.waiting import scaled

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
FIRST_PORT = 2222
# Files in root's home whose contents would slow every login or leak between nodes.
EMPTY_RC_FILES = ("/root/.bashrc", "/root/.profile", "/root/.bash_profile", "/root/.bash_login")
PRIVATE_HOME_DIRS = ("/root/.cache", "/root/.local")


def missing_requirements() -> Optional[str]:
    """Why a real cluster cannot start here, or None when it can."""
    if os.geteuid() != 0:
        return "the sshd test cluster needs root (namespaces, bind mounts, sshd)"
    if not os.path.exists(SSHD):
        return f"{SSHD} not found (apt-get install openssh-server)"
    if shutil.which("unshare") is None:
        return "unshare(1) not found (util-linux)"
    return None


def _write_ed25519(path: Path) -> str:
    """Write a new OpenSSH ed25519 private key to ``path``; return its public line."""
    key = Ed25519PrivateKey.generate()
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    pub = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    line = pub.decode()
    Path(f"{path}.pub").write_text(line + "\n")
    return line


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = value
    return base


def _fold(names: Sequence[str]) -> str:
    """Comma list; the inventory's node-set syntax accepts it as written."""
    return ",".join(names)


def _port_free(addresses: Sequence[str], port: int) -> bool:
    for address in addresses:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((address, port))
            except OSError:
                return False
    return True


def _pids_in_namespace(ns: str) -> list[int]:
    """Host PIDs of the live processes in PID namespace ``ns`` (a ``pid:[...]`` link)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") == ns:
                out.append(int(entry))
        except OSError:
            continue  # gone, or a zombie
    return out


class SshCluster:
    """N real sshd "machines" on 127.0.0.2, 127.0.0.3, ...; see the module docstring.

    Args:
        root: an empty directory that holds keys, configs, logs and node trees.
        n: number of nodes (at most 250).
        private_dirs: absolute paths each node owns privately (bind-mounted).
        prefix: node names are ``<prefix>01``... (3 digits from 100 nodes up).
    """

    # Each machine's namespaces (a subclass adds --uts to give machines their own hostname).
    UNSHARE: tuple[str, ...] = ("unshare", "--pid", "--mount", "--fork", "--kill-child", "--mount-proc")

    def __init__(
        self,
        root: Path,
        n: int,
        *,
        private_dirs: Sequence[str] = (),
        prefix: str = "node",
    ) -> None:
        if not 1 <= n <= 250:
            raise ValueError("a cluster has 1..250 nodes (one 127.0.0.N address each)")
        self.root = Path(root)
        width = 3 if n >= 100 else 2
        self.names = [f"{prefix}{i + 1:0{width}d}" for i in range(n)]
        self._addresses = {name: f"127.0.0.{i + 2}" for i, name in enumerate(self.names)}
        self.private_dirs = tuple(private_dirs)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock_file: Optional[Any] = None
        self._listening_lines: dict[str, int] = {}
        self.port = self._reserve_port()
        self.client_key = self.root / "client_ed25519"
        self.known_hosts = self.root / "known_hosts"
        self._prepare()

    # -- set-up -----------------------------------------------------------------

    def _reserve_port(self) -> int:
        addresses = list(self._addresses.values())
        for port in range(FIRST_PORT, FIRST_PORT + 200):
            handle = open(f"/tmp/brctl-test-sshd-{port}.lock", "w")  # noqa: SIM115
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                continue
            if _port_free(addresses, port):
                self._lock_file = handle
                return port
            handle.close()
        raise RuntimeError("no free port for the test cluster in 2222..2421")

    def _prepare(self) -> None:
        # sshd refuses to start without its privilege-separation directory.
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        # Bind mounts need existing mount points; these are ordinary empty directories.
        for path in (*PRIVATE_HOME_DIRS, *self.private_dirs):
            os.makedirs(path, exist_ok=True)
        client_pub = _write_ed25519(self.client_key)
        (self.root / "authorized_keys").write_text(client_pub + "\n")
        (self.root / "empty_rc").write_text("")
        lines = []
        for name in self.names:
            ndir = self.node_dir(name)
            ndir.mkdir(parents=True)
            pub = _write_ed25519(ndir / "ssh_host_ed25519_key")
            lines.append(f"[{self.address(name)}]:{self.port} {pub}")
            for path in (*PRIVATE_HOME_DIRS, *self.private_dirs):
                self.node_path(name, path).mkdir(parents=True, exist_ok=True)
            (ndir / "sshd_config").write_text(self._sshd_config(name))
        self.known_hosts.write_text("\n".join(lines) + "\n")

    def _sshd_config(self, name: str) -> str:
        ndir = self.node_dir(name)
        return "\n".join(
            [
                f"ListenAddress {self.address(name)}:{self.port}",
                f"HostKey {ndir / 'ssh_host_ed25519_key'}",
                "PidFile none",
                f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
                "UsePAM no",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                # The default 10:30:100 drops connections under fan-out (sshd's MaxStartups).
                "MaxStartups 2000:30:4000",
                "MaxSessions 1000",
                "AllowTcpForwarding yes",
                "UseDNS no",
                "PrintMotd no",
                "PrintLastLog no",
                "LogLevel VERBOSE",
                f"Subsystem sftp {SFTP_SERVER}",
                "",
            ]
        )

    def _boot_script(self, name: str) -> str:
        cmds = ["set -e"]
        for path in EMPTY_RC_FILES:
            if os.path.isfile(path):
                cmds.append(f"mount --bind {shlex.quote(str(self.root / 'empty_rc'))} {path}")
        for path in (*PRIVATE_HOME_DIRS, *self.private_dirs):
            src = shlex.quote(str(self.node_path(name, path)))
            cmds.append(f"mount --bind {src} {shlex.quote(path)}")
        cmds.append(self._node_main(name))
        return "; ".join(cmds)

    def _sshd_argv(self, name: str) -> str:
        ndir = self.node_dir(name)
        return f"{SSHD} -D -E {ndir / 'sshd.log'} -f {ndir / 'sshd_config'}"

    def _node_main(self, name: str) -> str:
        """The boot script's last command: what runs as the machine (here sshd alone)."""
        return f"exec {self._sshd_argv(name)}"

    # -- paths and addresses ----------------------------------------------------

    def node_dir(self, name: str) -> Path:
        """The node's directory under the cluster root (config, host key, log, tree)."""
        return self.root / "nodes" / name

    def node_path(self, name: str, path: str) -> Path:
        """Where ``path`` (one of the node's private paths, or below one) lives on the host."""
        return self.node_dir(name) / "fs" / path.lstrip("/")

    def address(self, name: str) -> str:
        """The node's 127.0.0.N address."""
        return self._addresses[name]

    # -- life cycle -------------------------------------------------------------

    def start(self) -> SshCluster:
        """Start every node not running; return when all accept connections."""
        for name in self.names:
            if name not in self._procs:
                self._spawn(name)
        for name in self.names:
            self._wait_listening(name)
        return self

    def start_node(self, name: str) -> None:
        """Start one node (after ``stop_node``) and wait until it listens."""
        if name not in self._procs:
            self._spawn(name)
        self._wait_listening(name)

    def stop_node(self, name: str) -> None:
        """Kill the node's namespace (sshd and everything it started); its port refuses."""
        proc = self._procs.pop(name, None)
        if proc is None:
            return
        try:
            ns: Optional[str] = os.readlink(f"/proc/{proc.pid}/ns/pid_for_children")
        except OSError:
            ns = None
        # Kill the namespace's PID 1 (sshd): the kernel then kills every process in
        # the namespace and PID 1 reaps them, and unshare reaps PID 1, so nothing is
        # left as a zombie. Killing unshare instead (--kill-child) would orphan PID 1.
        try:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        except OSError:
            children = []
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child), signal.SIGKILL)
        try:
            proc.wait(timeout=scaled(10))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        deadline = time.monotonic() + scaled(10)
        while time.monotonic() < deadline:
            if (ns is not None and _pids_in_namespace(ns)) or not _port_free(
                [self.address(name)], self.port
            ):
                time.sleep(0.01)
                continue
            return

    def freeze_node(self, name: str) -> None:
        """SIGSTOP every process of the node: it keeps its TCP connections but answers nothing."""
        self._signal_all(name, signal.SIGSTOP)

    def thaw_node(self, name: str) -> None:
        """Undo ``freeze_node``."""
        self._signal_all(name, signal.SIGCONT)

    def _signal_all(self, name: str, sig: signal.Signals) -> None:
        proc = self._procs.get(name)
        if proc is None:
            return
        ns = os.readlink(f"/proc/{proc.pid}/ns/pid_for_children")
        for pid in _pids_in_namespace(ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def stop(self) -> None:
        """Stop every node and release the port."""
        for name in list(self._procs):
            self.stop_node(name)
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def _spawn(self, name: str) -> None:
        argv = [*self.UNSHARE, "sh", "-c", self._boot_script(name)]
        err = open(self.node_dir(name) / "boot.err", "ab")  # noqa: SIM115
        try:
            self._procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True
            )
        finally:
            err.close()

    def _wait_listening(self, name: str) -> None:
        # Watch the log rather than connecting, so count_connections sees only real clients.
        deadline = time.monotonic() + scaled(15)
        proc = self._procs[name]
        log = self.node_dir(name) / "sshd.log"
        seen = self._listening_lines.get(name, 0)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                boot = (self.node_dir(name) / "boot.err").read_text(errors="replace")
                raise RuntimeError(
                    f"sshd for {name} exited {proc.returncode}: {boot}{self.log(name)}"
                )
            text = log.read_text(errors="replace") if log.exists() else ""
            count = text.count("Server listening on")
            if count > seen:
                self._listening_lines[name] = count
                return
            time.sleep(0.01)
        raise RuntimeError(f"sshd for {name} did not listen within 15 s: {self.log(name)}")

    def __enter__(self) -> SshCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- inspection -------------------------------------------------------------

    def log(self, name: str) -> str:
        """The node's sshd log so far."""
        path = self.node_dir(name) / "sshd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def count_connections(self, name: str) -> int:
        """TCP connections the node's sshd has accepted so far (``LogLevel VERBOSE`` lines)."""
        return len(re.findall(r"^.*Connection from \S+ port \d+ on ", self.log(name), re.M))

    def node_pids(self, name: str, pattern: str) -> list[int]:
        """Host PIDs of the node's processes whose command line matches regex ``pattern``."""
        proc = self._procs.get(name)
        if proc is None:
            return []
        try:
            # unshare's own PID namespace is the host's; its children's is the node's.
            ns = os.readlink(f"/proc/{proc.pid}/ns/pid_for_children")
        except OSError:
            return []
        rx = re.compile(pattern)
        out = []
        for pid in _pids_in_namespace(ns):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if rx.search(cmdline.decode(errors="replace")):
                out.append(pid)
        return out

    # -- inventories ------------------------------------------------------------

    def inventory(
        self,
        names: Optional[Sequence[str]] = None,
        job: Optional[Mapping[str, Any]] = None,
        node_env: Optional[Mapping[str, Mapping[str, str]]] = None,
        extra: Optional[Mapping[str, Any]] = None,
        python: Optional[str] = None,
    ) -> dict[str, Any]:
        """A YAML-ready inventory dict for ``names`` (default: all nodes).

        Args:
            names: the nodes to list, in this order.
            job: the ``job:`` section; ``nodes`` defaults to the listed names.
            node_env: per-node ``env:`` ({node: {VAR: value}}).
            extra: merged recursively into the result (e.g. ``{"ssh": {...}}``).
            python: ``ssh.python`` (the interpreter brctl's probes use on the nodes).

        Returns:
            The inventory: an ``ssh`` section with the throwaway key, the generated
            known_hosts and ``host_key_policy: strict``, and one ``nodes`` entry per node.
        """
        chosen = list(names) if names is not None else list(self.names)
        env = node_env or {}
        inv: dict[str, Any] = {
            "ssh": {
                "user": "root",
                "port": self.port,
                "identity_file": str(self.client_key),
                "known_hosts": str(self.known_hosts),
                "host_key_policy": "strict",
                "connect_timeout": scaled(10),
            },
            "nodes": [
                {
                    "name": n,
                    "address": self.address(n),
                    "port": self.port,
                    "env": dict(env.get(n, {})),
                }
                for n in chosen
            ],
        }
        if python is not None:
            inv["ssh"]["python"] = python
        if job is not None:
            inv["job"] = {"nodes": _fold(chosen), **job}
        if extra:
            _deep_merge(inv, extra)
        return inv

    def write_inventory(self, tmp_path: Path, filename: str = "inventory.yaml", **kw: Any) -> Path:
        """Write ``inventory(**kw)`` as YAML under ``tmp_path``; return the file."""
        path = Path(tmp_path) / filename
        path.write_text(yaml.safe_dump(self.inventory(**kw), sort_keys=False))
        return path


@contextlib.contextmanager
def silent_listener(address: str = "127.0.0.1") -> Iterator[tuple[str, int]]:
    """A TCP listener that accepts connections and never sends a byte (a hung sshd)."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind((address, 0))
    srv.listen(64)
    srv.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield address, srv.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=2)
        for conn in held:
            conn.close()
        srv.close()


@contextlib.contextmanager
def running_cluster(n: int, **kw: Any) -> Iterator[SshCluster]:
    """A started cluster in a fresh temp dir, stopped and removed afterwards (benchmarks)."""
    root = Path(tempfile.mkdtemp(prefix="brctl-cluster-"))
    cluster = SshCluster(root, n, **kw)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
