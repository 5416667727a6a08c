"""Files brctl writes on the controller, as root, into directories others may share.

``stacks --save DIR`` and ``report -o FILE`` write where the operator says: often
a shared dump directory (``/tmp/dumps``, a 1777 scratch space) where the job user
can plant a link (``job.json -> /etc/cron.d/x``) or swap a directory on the way for
one. The rules are the nodes' (``brctl.diagnostics.safefs``):

- The directory is reached following only links owned by root or the operator
  (``safefs.resolve_path`` with ``TRUSTED``) and opened by fd without following
  any link; what is missing below the last existing directory is made by brctl
  (``mkdir`` then an ``O_NOFOLLOW`` open), one component at a time.
- ``Tree.write_new`` creates each file ``O_CREAT|O_EXCL|O_NOFOLLOW`` relative to
  its directory fd: an existing name, a planted link included, is refused, never
  followed or overwritten.
- ``replace`` (a report page) writes a new temp file the same way and renames it
  over the name relative to the same fd: a link there is replaced, never followed.

Refusals are ``InputError`` (exit 2) naming the path.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
from pathlib import Path

from brctl.core.errors import InputError
from brctl.diagnostics import safefs


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def open_checked_dir(path: Path, shown: str, *, create: bool) -> int:
    """An fd of directory ``path`` (made, with its missing parents, when ``create``);
    ``shown`` starts each error message (``--save DIR``).

    Raises:
        InputError: a link on the way not owned by root or the operator, a component
            that is not a directory, or the directory cannot be made.
    """
    full = posixpath.normpath(os.path.join(os.getcwd(), os.path.expanduser(str(path))))
    missing: list[str] = []
    base = full
    while create and base != "/" and not os.path.lexists(base):
        base, name = posixpath.split(base)
        missing.insert(0, name)
    try:
        fd = safefs.open_dir(safefs.resolve_path(base, safefs.TRUSTED))
        for name in missing:
            nxt = safefs.make_dir(fd, name, 0o777 & ~_umask(), exist_ok=True)
            os.close(fd)
            fd = nxt
    except safefs.UnsafeName as exc:
        raise InputError(f"{shown}: {exc}") from None
    except OSError as exc:
        raise InputError(f"{shown}: {exc.strerror or exc}",
                         hint="links on the way are followed only when root or you own "
                              "them; name a directory only you can write") from None
    return fd


class Tree:
    """A directory brctl writes new files into, by fd (see the module docstring)."""

    def __init__(self, root: Path, flag: str) -> None:
        """Open (making it if missing) ``root``; ``flag`` names it in errors (``--save``)."""
        self.root, self.flag = root, flag
        self.fd = open_checked_dir(root, f"{flag} {root}", create=True)

    def write_new(self, relpath: str, text: str) -> None:
        """Create ``relpath`` (its directories made as needed) holding ``text``; never
        an existing name.

        Raises:
            InputError: the name exists (a link planted there too), or a write failed.
        """
        parent, name = posixpath.split(relpath)
        try:
            pfd = safefs.make_dirs(self.fd, parent, 0o777 & ~_umask()) if parent else os.dup(self.fd)
            try:
                fd = safefs.open_file(pfd, name, os.O_WRONLY | os.O_CREAT, 0o666 & ~_umask())
            finally:
                os.close(pfd)
        except FileExistsError:
            raise InputError(f"{self.flag} {self.root}: {relpath} exists; brctl writes only new "
                             "files here (an existing name, a link too, is never followed "
                             "or overwritten)", hint="give an empty or new directory") from None
        except OSError as exc:
            raise InputError(f"{self.flag} {self.root}: {relpath}: {exc.strerror or exc}") from None
        _write_all(fd, text.encode(), f"{self.flag} {self.root}/{relpath}")

    def close(self) -> None:
        """Close the directory fd."""
        os.close(self.fd)


def replace(path: Path, data: bytes, flag: str) -> None:
    """``path`` replaced by ``data`` in one rename relative to its checked directory:
    a reader never sees half a file, and a link at ``path`` is replaced, not followed.

    Raises:
        InputError: the directory is unsafe or missing, or the file cannot be written.
    """
    parent, name = posixpath.split(str(path))
    try:
        safefs.check_component(name)
    except safefs.UnsafeName as exc:
        raise InputError(f"{flag} {path}: {exc}") from None
    dfd = open_checked_dir(Path(parent or "."), f"cannot write in {parent or '.'}", create=False)
    tmp = f".{name}.{secrets.token_hex(6)}"
    try:
        try:
            fd = safefs.open_file(dfd, tmp, os.O_WRONLY | os.O_CREAT, 0o666 & ~_umask())
        except OSError as exc:
            raise InputError(f"cannot write in {parent or '.'}: {exc.strerror or exc}") from None
        try:
            _write_all(fd, data, f"{flag} {path}")
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        os.close(dfd)


def _write_all(fd: int, data: bytes, shown: str) -> None:
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    except OSError as exc:
        raise InputError(f"{shown}: {exc.strerror or exc}") from None
