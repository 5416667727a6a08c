"""The job side of ``brctl stacks``: one line in a training job serves its rank's evidence.

Opt in, one of::

    torchrun ... -m brctl.job -- train.py ARGS          # or: python -m brctl.job -- train.py
    torchrun ... -m brctl.job -m megatron.train ARGS    # a module instead of a script

    import brctl.job; brctl.job.serve()                  # first line of the training script
    brctl.job.report_step(step)                          # optional, after each step

Each rank then runs PyTorch's worker server (the one
``torch.distributed.elastic.control_plane.worker_main`` starts) on
``$BRCTL_JOB_SOCKET_DIR/rank-<RANK>.sock``; the directory defaults to
``/tmp/brctl-job-<uid>/``, is made mode 0700 and must belong to the job's user.
That layout is public (launch lines and brctl's probe name it) and does not move.
The server answers PyTorch's own handlers (``fr_trace_json``: the flight
recorder of every process group; ``dump_traceback``; ``ping``). brctl's own facts,
``{"v": 1, "rank", "pid", "world_size", "step", "groups": {name: {"desc",
"ranks"}}}`` (the process-group table, global ranks, that gloo's recorder lacks,
and the last step the job reported), are served beside it on
``rank-<RANK>.brctl.sock`` by a small thread of this module, in the same HTTP form
(``POST /handler/brctl_job``). Not as a handler of torch's server: a Python
handler registered there (``_register_handler``) aborts the process at exit
(torch 2.13: its registry drops the Python callable after the interpreter is
gone, "PyThreadState_Get: the function must be called with the GIL held"; every
rank of a job that finished exited 134). Both sockets are removed at exit.

Why a per-rank path: torch uses ``TORCH_WORKER_SERVER_SOCKET`` verbatim, so under
torchrun every local rank would inherit one path.

Standard library only at top level, torch imported inside functions, nothing else
of brctl: it works after ``pip install --no-deps brctl`` or from ``PYTHONPATH`` in
a training image. Serving never stops training: a problem is one line on stderr.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import runpy
import socket
import stat
import sys
import threading
from typing import Any

SOCKET_DIR_ENV = "BRCTL_JOB_SOCKET_DIR"
HANDLER = "brctl_job"
FORMAT = 1

_lock = threading.Lock()
MAX_REQUEST = 8192  # bytes of a request brctl's socket reads
_state: dict[str, Any] = {"step": None, "server": None, "path": None, "facts": None}


def socket_dir() -> str:
    """Where this job's rank sockets live: ``$BRCTL_JOB_SOCKET_DIR`` or ``/tmp/brctl-job-<uid>``."""
    return os.environ.get(SOCKET_DIR_ENV) or f"/tmp/brctl-job-{os.getuid()}"


def socket_path(rank: int, directory: str | None = None) -> str:
    """The socket of global rank ``rank``: ``<socket_dir>/rank-<rank>.sock``."""
    return os.path.join(directory or socket_dir(), f"rank-{int(rank)}.sock")


def facts_path(path: str) -> str:
    """Where brctl's facts are served beside torch's socket ``path``: ``rank-<R>.brctl.sock``."""
    return path[: -len(".sock")] + ".brctl.sock" if path.endswith(".sock") else path + ".brctl"


def report_step(step: int) -> None:
    """Record the last completed training step (brctl's handler reports it)."""
    _state["step"] = int(step)


def _own_dir(path: str) -> None:
    """Make ``path`` (mode 0700) or accept it only as this user's private directory: a
    directory another user made (``/tmp`` is shared) could hold its sockets instead."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} is not a directory (a symlink or a file is never used)")
    if st.st_uid != os.getuid():
        raise OSError(f"{path} belongs to uid {st.st_uid}, not to this job's uid {os.getuid()}")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)


def group_table() -> dict[str, dict[str, Any]]:
    """This rank's process groups: name → {"desc", "ranks": global ranks in group order}.

    gloo's flight recorder has no ``pg_config``, so the members of a group come
    from here. A rank knows only the groups it belongs to; names are job-wide.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return {}
    from torch.distributed.distributed_c10d import _world

    out: dict[str, dict[str, Any]] = {}
    for pg, name in list(_world.pg_names.items()):
        members = _world.pg_group_ranks.get(pg) or {}
        ranks = [g for g, _ in sorted(members.items(), key=lambda kv: kv[1])]
        out[str(name)] = {"desc": str(getattr(pg, "group_desc", "") or ""), "ranks": ranks}
    return out


def _env_int(name: str) -> int | None:
    """An environment value of ASCII digits as an int (``str.isdigit`` takes '²')."""
    value = os.environ.get(name, "")
    return int(value) if re.fullmatch(r"[0-9]{1,9}", value) else None


def facts() -> dict[str, Any]:
    """What ``brctl_job`` answers (also usable in-process)."""
    return {"v": FORMAT, "rank": _env_int("RANK"),
            "pid": os.getpid(), "world_size": _env_int("WORLD_SIZE"),
            "step": _state["step"], "groups": group_table()}


def _answer() -> bytes:
    try:
        body, status = json.dumps(facts()).encode(), "200 OK"
    except Exception as exc:  # never let an error take the serving thread down
        body, status = json.dumps({"v": FORMAT, "error": repr(exc)[:300]}).encode(), "500 Error"
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


class _FactsServer:
    """brctl's facts on a Unix socket, one short request at a time, from a daemon thread
    (it waits in ``accept`` with the GIL released; silent, as any Python code, while the
    main thread holds the GIL in native code)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._loop, name="brctl-job", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed by stop()
            with conn:
                try:
                    conn.settimeout(2.0)
                    got = b""
                    while b"\r\n\r\n" not in got and len(got) < MAX_REQUEST:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        got += chunk
                    if got:
                        conn.sendall(_answer())
                except OSError:
                    continue

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def serve(rank: int | None = None) -> str | None:
    """Start this rank's worker server on its socket; the path, or None when it cannot.

    ``rank`` defaults to ``$RANK`` (set by torchrun, Slurm wrappers, Megatron's
    launchers). Called twice, it returns the path already served. The sockets are
    removed when the process exits normally (``atexit``) or at ``stop()``; after a
    signal, by the rank's next ``serve()``.
    """
    with _lock:
        if _state["path"] is not None:
            return str(_state["path"])
        if rank is None:
            rank = _env_int("RANK")
            if rank is None:
                _warn("RANK is not set: no socket (run under torchrun or pass rank=)")
                return None
        directory = socket_dir()
        path = socket_path(rank, directory)
        try:
            _own_dir(directory)
            _remove_stale(path)
            _remove_stale(facts_path(path))
            from torch._C._distributed_c10d import _WorkerServer

            server = _WorkerServer(path)
        except Exception as exc:  # diagnostics never stop training
            _warn(f"cannot serve {path}: {exc}")
            return None
        try:
            own: _FactsServer | None = _FactsServer(facts_path(path))
        except OSError as exc:
            own = None
            _warn(f"cannot serve {facts_path(path)}: {exc}")
        _state.update(server=server, path=path, facts=own)
        # removed at a normal exit; SIGTERM is left alone (a Python handler runs only
        # when the main thread is back in the interpreter: a rank hung in native code, the
        # case this exists for, would no longer die of it). A killed rank's sockets are
        # replaced by its next serve(), and nothing answers on them meanwhile.
        atexit.register(stop)
        return path


def _remove_stale(path: str) -> None:
    """Remove a socket a killed run of this rank left (only a socket, and only ours)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(st.st_mode) and st.st_uid == os.getuid():
        os.unlink(path)
    else:
        raise OSError(f"{path} exists and is not this user's socket")


def stop() -> None:
    """Stop the server and remove its socket (idempotent)."""
    with _lock:
        server, path, own = _state["server"], _state["path"], _state["facts"]
        _state.update(server=None, path=None, facts=None)
    if own is not None:
        own.close()
    if server is not None:
        try:
            server.shutdown()
        except Exception as exc:
            _warn(f"worker server shutdown: {exc}")
    for name in (path, facts_path(path)) if path is not None else ():
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(name).st_mode):
                os.unlink(name)


def _warn(text: str) -> None:
    print(f"brctl.job: {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    """``python -m brctl.job [--] SCRIPT ARGS`` or ``python -m brctl.job -m MODULE ARGS``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args or (args[0] == "-m" and len(args) < 2):
        print("usage: python -m brctl.job [--] SCRIPT [ARGS...] | -m MODULE [ARGS...]",
              file=sys.stderr)
        raise SystemExit(2)
    serve()
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
            runpy.run_path(args[0], run_name="__main__")
    finally:
        stop()


if __name__ == "__main__":
    # run the imported module's main, not this copy's: ``import brctl.job`` in the
    # training script must see the state (step, server) this launch set up
    from brctl import job as _job

    _job.main()
