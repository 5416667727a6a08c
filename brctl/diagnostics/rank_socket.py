"""Probe side of the job's rank sockets: find each rank's worker server, check who holds
it, ask it for the flight recorder, brctl's group table and a traceback.

Node-side; standard library only, Python 3.9. ``stacks_probe`` calls ``read_job``.

The job user is hostile, and owns the directory the sockets are in. So:

- The directory (``$BRCTL_JOB_SOCKET_DIR`` of the rank where its environment is
  readable, else ``/tmp/brctl-job-<uid>``, the layout ``brctl.job`` serves) is
  reached through a verified directory fd (``safefs.open_dir``: no component a
  symlink), first below ``/proc/<pid>/root`` (a job in its own mount namespace),
  else in the probe's own; it must belong to the job's uid or root and not be
  group/other writable. At most ``MAX_LISTED`` entries are looked at.
- ``connect()`` follows a planted link, and checking a path before connecting is a
  race; so after connect and before sending a byte, ``SO_PEERCRED`` must name a
  process of the job's tree with that process's own uid. Anything else is closed
  unsent and is that rank's error. A peer in a PID namespace this probe cannot see
  (pid 0: another machine's rank on a shared ``/tmp``) is not this machine's.
- Every request has its own deadline (connect included); every answer is capped
  in size (``CAPS``) and depth (``MAX_DEPTH``) and parsed as JSON where JSON is
  expected; one bad answer is that rank's error, never the machine's.
- A rank's own ``TORCH_WORKER_SERVER_SOCKET`` (a job that starts torch's server
  itself) is asked the same way where its environment is readable.

Order per rank: ``fr_trace_json`` first (a native handler: it answers while the
main thread holds the GIL), then brctl's facts (``brctl_job`` on
``rank-N.brctl.sock``, served by a Python thread of ``brctl.job``: silent then) and
``dump_traceback``. When nothing answers, the process is wedged below Python:
``/proc/PID/wchan`` and ``/proc/PID/stack`` are read where the kernel allows.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import stat
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from brctl.diagnostics.recorder import RecorderFormatError, summarise
from brctl.diagnostics.safefs import open_dir

SOCKET_DIR_ENV = "BRCTL_JOB_SOCKET_DIR"
TORCH_SOCKET_ENV = "TORCH_WORKER_SERVER_SOCKET"
HANDLER = "brctl_job"  # brctl.job's handler
NAME = re.compile(r"rank-(\d{1,9})\.sock\Z")
MAX_LISTED = 4096  # directory entries looked at: a job user can make millions
MAX_DEPTH = 32  # nesting of a JSON answer (a dump is 4 deep)
MAX_HEAD = 16384  # bytes of an HTTP status line and headers
MAX_SUMMARY = 64 << 10  # bytes of one rank's summary in the answer (Megatron's: ~2-6 KB)
CAPS = {"fr_trace_json": 32 << 20, HANDLER: 1 << 20, "dump_traceback": 1 << 20}
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class SocketError(Exception):
    """One request that gave no usable answer; ``kind``: peer, timeout, refused, malformed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ForeignPeer(SocketError):
    """The listener is in a PID namespace this probe cannot see (not this machine's)."""


def _read(path: str, cap: int = 65536) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(cap)
    except OSError:
        return None


def proc_uid(pid: int) -> int | None:
    """The real uid of ``pid`` from ``/proc/PID/status`` (readable without ptrace)."""
    for line in (_read(f"/proc/{pid}/status") or b"").decode("ascii", "replace").splitlines():
        if line.startswith("Uid:"):
            parts = line.split()
            return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    return None


def socket_env(pid: int) -> dict[str, str] | None:
    """The two socket settings of ``pid``'s environment (None: environ refused); only
    these are kept, and they never leave the machine."""
    raw = _read(f"/proc/{pid}/environ", 1 << 20)
    if raw is None:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        name = key.decode("ascii", "replace")
        if sep and name in (SOCKET_DIR_ENV, TORCH_SOCKET_ENV):
            out[name] = value.decode("utf-8", "replace")
    return out


def open_socket_dir(path: str, pid: int, uid: int) -> tuple[int, str]:
    """A verified fd of the socket directory ``path`` as process ``pid`` sees it, and how
    it was reached. Refused (``OSError``): a symlink on the way, another owner, a
    directory others can write."""
    if not path.startswith("/") or os.path.normpath(path) != path:
        raise OSError(errno.EINVAL, f"{path!r}: not an absolute normalised path")
    fd = -1
    try:
        root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        root = -1  # refused without ptrace rights: the probe's own mount namespace
    try:
        if root >= 0 and path != "/":
            try:
                fd, how = open_dir(path.lstrip("/"), root), f"/proc/{pid}/root{path}"
            except FileNotFoundError:
                fd = -1
        if fd < 0:
            fd, how = open_dir(path), path
    finally:
        if root >= 0:
            os.close(root)
    st = os.fstat(fd)
    why = None
    if st.st_uid not in (uid, 0):
        why = f"it belongs to uid {st.st_uid}, not to the job's uid {uid} or root"
    elif st.st_mode & 0o022:
        why = f"others can write it (mode {stat.S_IMODE(st.st_mode):04o})"
    if why:
        os.close(fd)
        raise OSError(errno.EPERM, f"socket directory {how}: {why}; not used")
    return fd, how


def list_sockets(dir_fd: int) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(claimed rank, name) of the ``rank-N.sock`` sockets in the directory, sorted, and
    (claimed rank, why) for such names that are not sockets (a planted link: never used)."""
    found, odd = [], []
    with os.scandir(dir_fd) as it:
        for n, entry in enumerate(it):
            if n >= MAX_LISTED:
                break
            m = NAME.match(entry.name)
            if not m:
                continue
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue  # unlinked since it was listed
            if stat.S_ISSOCK(mode):
                found.append((int(m.group(1)), entry.name))
            else:
                kind = "a symlink" if stat.S_ISLNK(mode) else "not a socket"
                odd.append((int(m.group(1)), f"{entry.name} is {kind}; not used"))
    return sorted(found), sorted(odd)


def _peer(sock: socket.socket) -> tuple[int, int, int]:
    pid, uid, gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                 _CRED.size))
    return pid, uid, gid


def request(path: str, handler: str, deadline: float,
            check: Callable[[int, int], None], cap: int | None = None) -> bytes:
    """POST ``/handler/<handler>`` over the Unix socket ``path``; the body of a 200 answer.

    ``check(pid, uid)`` judges the peer after connect and before a byte is sent; it
    raises to refuse. The whole exchange ends by ``deadline`` (``time.monotonic``).
    """
    cap = cap if cap is not None else CAPS.get(handler, 1 << 20)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            sock.connect(path)
        except socket.timeout:
            raise SocketError("timeout", f"{handler}: connect did not finish in time") from None
        except OSError as exc:
            raise SocketError("refused", f"{handler}: cannot connect: {exc.strerror}") from None
        pid, uid, _ = _peer(sock)
        check(pid, uid)
        sock.sendall(f"POST /handler/{handler} HTTP/1.1\r\nHost: localhost\r\n"
                     "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
        return _response(sock, handler, deadline, cap)
    except socket.timeout:
        raise SocketError("timeout", f"{handler}: no answer in time") from None
    except OSError as exc:
        raise SocketError("refused", f"{handler}: {exc.strerror or exc}") from None
    finally:
        sock.close()


def _recv(sock: socket.socket, deadline: float, n: int = 65536) -> bytes:
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout()
    sock.settimeout(left)
    return sock.recv(n)


def _head(sock: socket.socket, handler: str, deadline: float
          ) -> tuple[str, dict[str, str], bytes]:
    """(status code, headers in lower case, the body's first bytes) of an HTTP answer."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > MAX_HEAD:
            raise SocketError("malformed", f"{handler}: HTTP headers over {MAX_HEAD} bytes")
        chunk = _recv(sock, deadline)
        if not chunk:
            raise SocketError("malformed", f"{handler}: the connection closed before an answer")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split()
    if len(status) < 2 or not status[0].startswith("HTTP/") or not status[1].isdigit():
        raise SocketError("malformed", f"{handler}: not an HTTP answer: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    return status[1], headers, body


def _response(sock: socket.socket, handler: str, deadline: float, cap: int) -> bytes:
    code, headers, body = _head(sock, handler, deadline)
    length = headers.get("content-length")
    if "transfer-encoding" in headers:
        # torch's server and brctl.job's send Content-Length; a chunked answer is not theirs
        raise SocketError("malformed", f"{handler}: a Transfer-Encoding answer; not read")
    if length is not None and not _DIGITS.fullmatch(length):
        raise SocketError("malformed", f"{handler}: Content-Length {length[:20]!r}")
    want = int(length) if length is not None else None
    if want is not None and want > cap:
        raise SocketError("malformed", f"{handler}: an answer of {want} bytes, over {cap}")
    parts = [body]
    size = len(body)
    while want is None or size < want:
        if size > cap:
            raise SocketError("malformed", f"{handler}: an answer over {cap} bytes")
        chunk = _recv(sock, deadline)
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    data = b"".join(parts)
    if want is not None:
        if len(data) < want:
            raise SocketError("malformed", f"{handler}: {len(data)} of {want} bytes came")
        data = data[:want]
    if code != "200":
        raise SocketError("refused", f"{handler}: HTTP {code}: "
                                     f"{data[:120].decode('utf-8', 'replace')!r}")
    return data


_DIGITS = re.compile(r"[0-9]{1,12}")  # ASCII only: str.isdigit takes '²'


def _small_int(text: str) -> int:
    if len(text) > 20:  # no int64 is longer; a huge literal parses in quadratic time on 3.9
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON a recorder sends")


def parse_json(data: bytes, handler: str) -> Any:
    """``data`` as JSON, nested at most ``MAX_DEPTH`` deep."""
    try:
        doc = json.loads(data, parse_int=_small_int, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise SocketError("malformed", f"{handler}: not JSON: {str(exc)[:120]}") from None
    todo = [(doc, 1)]
    while todo:
        value, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise SocketError("malformed", f"{handler}: nested over {MAX_DEPTH} deep")
        if type(value) is dict:
            todo.extend((v, depth + 1) for v in value.values() if type(v) in (dict, list))
        elif type(value) is list:
            todo.extend((v, depth + 1) for v in value if type(v) in (dict, list))
    return doc


def _stat_letter(pid: int) -> str:
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return ""
    rest = raw.decode("utf-8", "replace").rsplit(")", 1)[-1].split()
    return rest[0] if rest else ""


def _kernel_wait(pid: int) -> str | None:
    """Where the kernel has the process wait (wchan, the kernel stack's top), if readable."""
    wchan = (_read(f"/proc/{pid}/wchan", 256) or b"").decode("ascii", "replace").strip()
    stack = (_read(f"/proc/{pid}/stack", 4096) or b"").decode("ascii", "replace").split("\n")
    top = " ".join(stack[0].split()[1:2]) if stack and stack[0] else ""
    text = ", ".join(x for x in (wchan if wchan not in ("", "0") else "", top) if x)
    return text[:200] or None


class Reading:
    """What one rank's socket gave (filled in by ``_read_rank``)."""

    def __init__(self, rank: int, pid: int, path: str, channel: str) -> None:
        self.rank, self.pid, self.path, self.channel = rank, pid, path, channel
        # brctl.job serves its facts beside torch's socket (rank-N.brctl.sock), same peer
        self.table_path = path[: -len(".sock")] + ".brctl.sock" if channel == "brctl-socket" \
            else ""
        self.dump: Any = None
        self.raw: bytes | None = None
        self.table: Any = None
        self.traceback = False
        self.errors: list[str] = []
        self.timed_out = False
        self.clock_ns = 0


def _read_rank(r: Reading, allowed: Callable[[int, int], None], timeout: float) -> None:
    def ask(handler: str, path: str = r.path) -> bytes | None:
        try:
            return request(path, handler, time.monotonic() + timeout, allowed)
        except SocketError as exc:
            r.timed_out = r.timed_out or exc.kind == "timeout"
            r.errors.append(str(exc))
            return None

    raw = ask("fr_trace_json")
    r.clock_ns = time.time_ns()
    if raw is None:
        return  # the server thread is gone or wedged too: the others would only wait
    r.raw = raw
    try:
        r.dump = parse_json(raw, "fr_trace_json")
    except SocketError as exc:
        r.errors.append(str(exc))
    table = ask(HANDLER, r.table_path) if r.table_path else None
    if table is not None:
        try:
            r.table = parse_json(table, HANDLER)
        except SocketError as exc:
            r.errors.append(str(exc))
    r.traceback = ask("dump_traceback") is not None


def _checker(tree: dict[int, int], want_pid: int | None) -> Callable[[int, int], None]:
    """The peer rule: a pid of the job's tree (``want_pid`` once known), with its own uid."""

    def check(pid: int, uid: int) -> None:
        if pid == 0:
            raise ForeignPeer("peer", "its server is in a PID namespace this machine cannot see")
        if pid not in tree or (want_pid is not None and pid != want_pid):
            raise SocketError("peer", f"the socket's peer is pid {pid} (uid {uid}), not a "
                                      "process of the job; closed unsent")
        if tree[pid] != uid:
            raise SocketError("peer", f"the socket's peer pid {pid} runs as uid {uid}, not "
                                      f"as uid {tree[pid]}, that process's; closed unsent")

    return check


class _Plan:
    """What to ask on this machine: the sockets found, the directories they are in."""

    def __init__(self, wanted: set[int], any_rank: bool) -> None:
        self.wanted, self.any_rank = wanted, any_rank
        self.todo: dict[tuple[str, int], Reading] = {}  # (path, claimed rank) → what to ask
        self.dirs: dict[tuple[int, int], int] = {}  # (dev, ino) → verified fd, open while asked
        self.oddities: dict[int, str] = {}  # claimed rank → why its name is no usable socket
        self.errors: list[str] = []

    def scan(self, pid: int, uid: int, rank: int | None) -> None:
        """Add the sockets process ``pid`` (``rank``: its RANK, when readable) may serve."""
        env = socket_env(pid) or {}
        torch_path = env.get(TORCH_SOCKET_ENV, "")
        if torch_path.startswith("/") and rank is not None and rank in self.wanted:
            self.todo.setdefault((torch_path, rank), Reading(rank, pid, torch_path,
                                                             "torch-socket"))
        where = env.get(SOCKET_DIR_ENV) or f"/tmp/brctl-job-{uid}"
        try:
            fd, how = open_socket_dir(os.path.normpath(where), pid, uid)
        except FileNotFoundError:
            return
        except OSError as exc:
            if str(exc) not in self.errors:
                self.errors.append(str(exc))
            return
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) in self.dirs:
            os.close(fd)
            return
        self.dirs[(st.st_dev, st.st_ino)] = fd
        listed, odd = list_sockets(fd)
        for claimed, why in odd:
            if claimed in self.wanted:
                self.oddities.setdefault(claimed, why)
        for claimed, name in listed:
            if claimed in self.wanted or self.any_rank:
                # through the verified fd: the directory cannot be swapped after its check
                self.todo.setdefault((how, claimed), Reading(
                    claimed, 0, f"/proc/self/fd/{fd}/{name}", "brctl-socket"))

    def close(self) -> None:
        for fd in self.dirs.values():
            os.close(fd)


def read_job(procs: list[dict[str, Any]], options: dict[str, Any],
             only: list[int] | None = None) -> dict[str, Any]:
    """Find and read the sockets of the job's ranks on this machine.

    ``procs``: ``find_processes``'s rows (role ``rank``, ``worker``, ``unread``,
    ``launcher``). Returns ``{"readings": {pid: Reading}, "found": {pid: rank},
    "errors": [str], "refused": [Reading]}``: ``found`` maps processes whose
    environment was refused to the rank their socket told; ``errors`` are the
    machine's (a refused directory); ``refused`` the sockets of claimed ranks that
    gave nothing (a peer not the job's, a name that is not a socket).
    """
    timeout = float(options.get("timeout") or 2.0)
    tree: dict[int, int] = {}
    for p in procs:
        uid = proc_uid(p["pid"])
        if uid is not None:
            tree[p["pid"]] = uid
    ranks = {p["pid"]: p["rank"] for p in procs if p["role"] == "rank"}
    blind = [p["pid"] for p in procs if p["role"] == "unread"]
    plan = _Plan(set(ranks.values()) if only is None else set(only), bool(blind) and only is None)
    try:
        for pid in [*ranks, *blind]:
            if pid in tree:
                plan.scan(pid, tree[pid], ranks.get(pid))
        out = _ask_all(list(plan.todo.values()), tree, ranks, timeout, plan.errors, options,
                       len(ranks) + len(blind))
    finally:
        plan.close()
    seen = {r.rank for r in out["readings"].values()} | {r.rank for r in out["refused"]}
    for claimed, why in sorted(plan.oddities.items()):
        if claimed not in seen:
            odd = Reading(claimed, 0, "", "none")
            odd.errors.append(why)
            out["refused"].append(odd)
    return out


def _ask_all(todo: list[Reading], tree: dict[int, int], ranks: dict[int, int], timeout: float,
             errors: list[str], options: dict[str, Any], peers: int) -> dict[str, Any]:
    """Ask every socket of ``todo``; ``peers``: at most this many distinct processes are read
    (a job process listening on thousands of sockets costs one reading, not thousands).
    The whole of it ends by one deadline (``budget``), whatever the job's sockets do."""
    lock = threading.Lock()
    readings: dict[int, Reading] = {}
    found: dict[int, int] = {}
    refused: dict[int, Reading] = {}  # claimed rank → a socket whose peer was refused
    taken: set[int] = set()  # peer pids being read
    end = time.monotonic() + float(options.get("budget") or 4 * timeout + 2)

    def one(r: Reading) -> None:
        if time.monotonic() + timeout > end:
            r.errors.append("not asked: the machine's socket reading ran out of time")
            with lock:
                refused.setdefault(r.rank, r)
            return
        try:
            pid, uid = _first_peer(r.path, timeout)
            _checker(tree, None)(pid, uid)
        except ForeignPeer:
            return
        except SocketError as exc:
            r.errors.append(str(exc))
            with lock:
                refused.setdefault(r.rank, r)
            return
        with lock:
            if pid in taken or len(taken) >= peers:
                return  # this process is read through another of its sockets
            taken.add(pid)
        r.pid = pid
        if _stat_letter(pid) not in ("T", "t", "Z"):  # stopped or dead: asking only waits
            _read_rank(r, _checker(tree, pid), min(timeout, max(0.001, end - time.monotonic())))
        with lock:
            if pid in ranks:
                r.rank = ranks[pid]  # the environment's RANK, read by the kernel's rules
            elif type(r.table) is dict and type(r.table.get("rank")) is int and \
                    r.table.get("pid") == pid:
                r.rank = r.table["rank"]
            readings[pid] = r
            if pid not in ranks:
                found[pid] = r.rank

    def guarded(r: Reading) -> None:
        try:
            one(r)
        except Exception as exc:  # one rank's socket never takes the machine's answer down
            r.errors.append(f"reading its socket failed: {type(exc).__name__}: {str(exc)[:200]}")
            with lock:
                refused.setdefault(r.rank, r)

    workers = max(1, min(int(options.get("concurrency") or 8), len(todo) or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(guarded, todo))
    seen = {r.rank for r in readings.values()}
    bad = [r for rank, r in sorted(refused.items()) if rank not in seen]
    return {"readings": readings, "found": found, "errors": errors, "refused": bad}


def _first_peer(path: str, timeout: float) -> tuple[int, int]:
    """Connect, read the peer's credentials, close unsent (who serves this socket?)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        pid, uid, _ = _peer(sock)
        return pid, uid
    except socket.timeout:
        raise SocketError("timeout", "connect did not finish in time") from None
    except OSError as exc:
        raise SocketError("refused", f"cannot connect: {exc.strerror or exc}") from None
    finally:
        sock.close()


def record(reading: Reading | None, rank: int, pid: int, *, k: int, stack: bool,
           dump_error: str | None) -> dict[str, Any]:
    """The probe's per-rank answer (``channel``, ``state``, ``summary`` ...), from its socket
    reading (or None) and its py-spy outcome (``stack``: a stack came; ``dump_error``)."""
    proc_state = _stat_letter(pid)
    out: dict[str, Any] = {"rank": rank, "pid": pid, "channel": "none", "state": "unread",
                           "proc_state": proc_state, "traceback": False, "table": False,
                           "error": None, "summary": None, "wchan": None}
    errors = []
    timed_out = bool(dump_error and "did not finish within" in dump_error)
    if reading is not None:
        out["channel"] = reading.channel
        out["traceback"] = reading.traceback
        out["table"] = type(reading.table) is dict
        timed_out = timed_out or reading.timed_out
        errors.extend(reading.errors)
        if reading.dump is not None:
            table = reading.table if type(reading.table) is dict else None
            try:
                out["summary"] = summarise(reading.dump, table, reading.clock_ns, k)
            except (RecorderFormatError, ValueError, TypeError, KeyError) as exc:
                errors.append(f"fr_trace_json: not a flight-recorder dump: {str(exc)[:160]}")
            size = len(json.dumps(out["summary"])) if out["summary"] is not None else 0
            if size > MAX_SUMMARY:  # one rank must not push the machine's answer over its cap
                out["summary"] = None
                errors.append(f"fr_trace_json: a summary of {size} bytes, over {MAX_SUMMARY}")
    if out["summary"] is not None or stack:
        out["state"] = "read"
    elif proc_state in ("D", "T", "t", "Z") or timed_out:
        out["state"] = "unresponsive"
    if out["summary"] is None and not stack:
        out["wchan"] = _kernel_wait(pid)
    out["error"] = "; ".join(errors)[:600] or None
    return out
