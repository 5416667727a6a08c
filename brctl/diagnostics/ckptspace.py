"""Room on a backup peer's filesystem, and the partial files a failed receive leaves.

Node-side, standard library only (Python >= 3.9), used by ``ckptfiles prepare`` and
``ckptmove receive``. Threat: a job user's step can hold a sparse file (a terabyte
of holes costs it nothing) that brctl, as root, would write out dense on the peer,
past quotas and the root reserve, filling the peer's checkpoint filesystem, and a
receive that failed, timed out or was killed left its full-size temp file behind.

- ``check_room``: before the first byte, the destination must take the step's bytes
  (every file counted at its size: what a dense copy costs there, however few blocks
  it has at the source) and still keep ``margin`` bytes free, counted in what an
  unprivileged writer may use (``f_bavail``: the root reserve is not room). Else
  ``NoRoom`` (ENOSPC) naming bytes needed, free and kept.
- ``sweep_partials``: remove what an earlier receive left (``PARTIAL_PREFIX`` files,
  this uid's, below a backup step brctl made), by fd, following no link.
"""

from __future__ import annotations

import errno
import os
import stat

PARTIAL_PREFIX = ".brctl-partial-"


class NoRoom(OSError):
    """The destination cannot take the step and keep its margin (``errno.ENOSPC``)."""

    def __init__(self, need: int, free: int, margin: int) -> None:
        super().__init__(errno.ENOSPC, f"no room for the step: {need} bytes to copy, {free} "
                                       f"free, {margin} kept free (ckpt.backup_margin)")
        self.need, self.free, self.margin = need, free, margin


def margin_bytes(fd: int, margin: float) -> int:
    """``margin`` as bytes: a fraction of the filesystem below 1, else bytes."""
    st = os.fstatvfs(fd)
    return int(margin * st.f_blocks * st.f_frsize) if margin < 1 else int(margin)


def check_room(fd: int, need: int, margin: float) -> dict[str, int]:
    """``{need, free, margin}`` when the filesystem of ``fd`` takes ``need`` more bytes
    and keeps ``margin``; ``NoRoom`` else."""
    st = os.fstatvfs(fd)
    free = st.f_bavail * st.f_frsize
    keep = margin_bytes(fd, margin)
    if need + keep > free:
        raise NoRoom(need, free, keep)
    return {"need": need, "free": free, "margin": keep}


def sweep_partials(dir_fd: int) -> int:
    """Remove this uid's ``PARTIAL_PREFIX`` files below ``dir_fd``; how many went.

    Iterative, one fd open at a time (a copied tree may nest deeper than Python's
    recursion limit, or the fd limit): down by ``O_NOFOLLOW`` name, back up by ``..``,
    checked to be the very directory it came from (else the sweep stops there); a
    directory that does not open is left alone."""
    gone = 0
    stack: list[tuple[list[str], tuple[int, int]]] = []  # (subdirs left, its dev/ino)
    fd = os.dup(dir_fd)
    try:
        while True:
            with os.scandir(fd) as it:
                entries = list(it)
            subdirs = []
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    subdirs.append(entry.name)
                elif (entry.name.startswith(PARTIAL_PREFIX) and stat.S_ISREG(st.st_mode)
                      and st.st_uid == os.geteuid()):
                    os.unlink(entry.name, dir_fd=fd)
                    gone += 1
            here = os.fstat(fd)
            stack.append((subdirs, (here.st_dev, here.st_ino)))
            while True:  # the next directory down, backing up past the finished ones
                names = stack[-1][0]
                if not names:
                    stack.pop()
                    if not stack:
                        return gone
                    up = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                    os.close(fd)
                    fd = up
                    st = os.fstat(fd)
                    if (st.st_dev, st.st_ino) != stack[-1][1]:
                        return gone  # moved while it was swept: not followed
                    continue
                try:
                    child = os.open(names.pop(), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                    dir_fd=fd)
                except OSError:
                    continue
                break
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def ready(area_fd: int, req: dict) -> dict:  # type: ignore[type-arg]
    """``prepare``'s last word on a source's backup area: partials swept in all of it (a
    killed receive of an older step left them too), room checked for the request's
    ``need`` bytes and ``margin``; ``{ok, room}`` or ``{ok: False, no_room}``."""
    sweep_partials(area_fd)  # what a failed, timed-out or killed receive left
    try:
        room = check_room(area_fd, int(req.get("need", 0)), float(req.get("margin", 0)))
    except NoRoom as exc:
        return {"ok": False, "no_room": {"need": exc.need, "free": exc.free, "margin": exc.margin}}
    return {"ok": True, "room": room}
