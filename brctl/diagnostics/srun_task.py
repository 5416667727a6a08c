"""Node side of ``connection: slurm``: one ``srun`` task is one node's run, answered as one record.

``python3 -I -S -c <this file> NONCE KEEP ARGV...`` (the transport sends the source
itself, like the reaper's). stdin is the payload srun broadcasts to every task:
zlib-compressed JSON ``{"stdins": [base64, ...], "nodes": {name: index or -1}}``;
this task takes the entry of its own node (``$SLURMD_NODENAME``), runs ARGV (the
command under the reaper, so timeouts and the kill of its whole tree are the
reaper's, as over ssh) with that stdin, keeps the first and last KEEP bytes of its
stdout and stderr, and prints nothing but one record::

    @brctl NONCE begin LENGTH SHA256
    @brctl NONCE <base64 of the JSON answer, at most CHUNK characters a line>
    @brctl NONCE end

``srun --label`` prefixes every line a task writes with that task's rank, so a node
(or whatever runs there) can garble only its own record, never forge another's. The
answer: ``{"node", "exit", "seconds", "out": [head, tail, total], "err": [...]}``
(head and tail base64). ARGV's first word ``python3`` (the reaper's interpreter) is
this task's own: the transport chose it by the same rule (``python3`` where the PATH
has one, else the node's configured ``python``). Standard library only; Python >= 3.9.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
import zlib
from typing import IO

CHUNK = 600  # base64 characters per record line: far below srun's line buffer
LINGER_S = 1.0  # after the command exits, how long its output may still arrive


class Kept:
    """The first and last ``keep`` bytes of a stream, and its length."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.keep:
                del self.tail[:-self.keep]

    def parts(self) -> list[object]:
        tail = bytes(self.tail[-self.keep:]) if self.tail else b""
        return [base64.b64encode(bytes(self.head)).decode(), base64.b64encode(tail).decode(), self.total]


def my_stdin(payload: bytes, node: str) -> bytes | None:
    """This node's stdin from the broadcast payload (None: the command gets none).

    Raises:
        ValueError: a payload that does not parse, or no entry for ``node``.
    """
    doc = json.loads(zlib.decompress(payload)) if payload else {"stdins": [], "nodes": {}}
    index = doc["nodes"].get(node)
    if index is None:
        raise ValueError(f"the request names no entry for node {node!r}")
    return None if index < 0 else base64.b64decode(doc["stdins"][index])


def _feed(pipe: IO[bytes], data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except OSError:
        pass  # the command exited without reading it all: its exit status says how it went


def run(argv: list[str], stdin: bytes | None, keep: int) -> tuple[int, Kept, Kept]:
    """Run ``argv`` with ``stdin``; its exit code and kept output."""
    out, err = Kept(keep), Kept(keep)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        err.add(f"{argv[0]}: {exc.strerror}\n".encode())
        return 127, out, err
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)  # type: ignore[arg-type]
        sel.register(proc.stderr, selectors.EVENT_READ, err)  # type: ignore[arg-type]
        exited = None
        while sel.get_map():
            if exited is None and proc.poll() is not None:
                exited = time.monotonic()
            if exited is not None and time.monotonic() - exited >= LINGER_S:
                break  # a background child holds the pipe: done, as under ssh
            for key, _ in sel.select(LINGER_S):
                data = os.read(key.fd, 1 << 16)
                if data:
                    key.data.add(data)
                else:
                    sel.unregister(key.fileobj)
    return proc.wait(), out, err


def record(nonce: str, answer: dict[str, object]) -> str:
    """The framed lines of one answer."""
    body = json.dumps(answer, separators=(",", ":")).encode()
    text = base64.b64encode(body).decode()
    lines = [f"@brctl {nonce} begin {len(body)} {hashlib.sha256(body).hexdigest()}"]
    lines += [f"@brctl {nonce} {text[i:i + CHUNK]}" for i in range(0, len(text), CHUNK)]
    lines.append(f"@brctl {nonce} end")
    return "\n".join(lines) + "\n"


def main(args: list[str]) -> int:
    nonce, keep, argv = args[0], int(args[1]), args[2:]
    if argv and argv[0] == "python3":  # wrap.SYSTEM_PYTHON: the reaper runs where we run
        argv = [sys.executable or "python3", *argv[1:]]
    node = os.environ.get("SLURMD_NODENAME", "")
    start = time.monotonic()
    answer: dict[str, object] = {"node": node}
    try:
        stdin = my_stdin(sys.stdin.buffer.read(), node)
    except (ValueError, KeyError, IndexError, TypeError, zlib.error) as exc:
        answer.update(exit=None, error=f"unusable request: {exc}")
    else:
        code, out, err = run(argv, stdin, keep)
        answer.update(exit=code, out=out.parts(), err=err.parts())
    answer["seconds"] = round(time.monotonic() - start, 3)
    sys.stdout.write(record(nonce, answer))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
