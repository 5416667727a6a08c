"""The state store: one SQLite database (WAL) in the state directory.

Each feature owns its tables and declares them as a ``Component`` with an ordered
list of migrations; ``Store.migrate`` applies the ones not yet applied, recorded
per component in ``schema_versions``. Migrations never change once released: add
a new step instead. Writes are short transactions; many processes may share the
file (the daemon, cron-run commands), so a busy timeout is set.

A damaged file is an input error, never a crash: any ``sqlite3.DatabaseError``
while it is opened, read or written is ``StateDamaged`` (exit 2, naming the
database and how to recover), so the shipped unit, which does not restart on
exit 2, stops instead of looping on it. A database that is only busy or out of room
(locked past the busy timeout, a full disk, an I/O error) is ``StateBusy``: exit 3,
which the unit restarts on, since waiting mends it and stopping would leave the job
unwatched.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from brctl.core.errors import IncompleteError, InputError

DB_NAME = "brctl.db"
_BUSY_TIMEOUT_MS = 30_000  # the daemon and a cron job may write at the same moment


RECOVER = ("restore a copy of it, or move it aside (brctl starts a new one; the daemon's "
           "history, quarantine and ETTR records stay in the old file)")


class StateDamaged(InputError):
    """The state database cannot be read or written (damaged, or not a database)."""


class StateBusy(IncompleteError):
    """The state database is there but cannot be used now (locked past the busy timeout,
    its disk full, an I/O error): exit 3, so a retry (the daemon's unit restarts on 3, not
    on 2) picks up where it stopped instead of leaving the job unwatched for good."""


# SQLite's transient conditions, as its messages name them (SQLITE_BUSY/LOCKED/FULL/IOERR);
# a damaged page or a file that is not a database is never one of them.
_TRANSIENT = ("locked", "busy", "disk is full", "disk i/o error")


def _damaged(path: Path, exc: sqlite3.Error) -> StateDamaged | StateBusy:
    if isinstance(exc, sqlite3.OperationalError) and any(
            word in str(exc).lower() for word in _TRANSIENT):
        return StateBusy(f"state database {path}: {exc}",
                         hint="another brctl may hold it past the busy timeout, or its "
                              "filesystem is full or failing; run again once it is free")
    return StateDamaged(f"state database {path}: {exc}", hint=RECOVER)


@dataclass(frozen=True)
class Component:
    """A feature's tables: ``name`` and its migrations, applied in order, each once."""

    name: str
    migrations: Sequence[str]


class Store:
    """A connection to ``<state dir>/brctl.db``; thread-safe for short transactions."""

    def __init__(self, directory: Path) -> None:
        """Open (creating) the database under ``directory``."""
        self.path = directory / DB_NAME
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            _private(self.path)
            self._db = sqlite3.connect(str(self.path), timeout=_BUSY_TIMEOUT_MS / 1000,
                                       isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS schema_versions ("
                " component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
            )
        except sqlite3.DatabaseError as exc:
            raise _damaged(self.path, exc) from None
        except (OSError, sqlite3.Error) as exc:
            raise InputError(f"state database {self.path}: {exc}",
                             hint="set $BRCTL_STATE to a writable directory") from None
        self._db.row_factory = sqlite3.Row
        self._lock = threading.RLock()

    def migrate(self, component: Component) -> None:
        """Apply ``component``'s migrations that this database has not seen yet."""
        with self.transaction() as db:
            row = db.execute("SELECT version FROM schema_versions WHERE component = ?",
                             (component.name,)).fetchone()
            have = row[0] if row else 0
            if have > len(component.migrations):
                raise InputError(
                    f"state database {self.path}: {component.name} schema v{have} is newer "
                    f"than this brctl (v{len(component.migrations)})",
                    hint="upgrade brctl or point $BRCTL_STATE elsewhere")
            for sql in component.migrations[have:]:
                for statement in _statements(sql):
                    db.execute(statement)
            db.execute("INSERT INTO schema_versions(component, version) VALUES(?, ?) "
                       "ON CONFLICT(component) DO UPDATE SET version = excluded.version",
                       (component.name, len(component.migrations)))

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` (rolled back on error); ``StateDamaged`` for
        a ``sqlite3.DatabaseError`` on the way."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                raise _damaged(self.path, exc) from None

    def query(self, sql: str, params: Sequence[object] = ()) -> list[sqlite3.Row]:
        """Run a read query (``StateDamaged`` for a ``sqlite3.DatabaseError``)."""
        with self._lock:
            try:
                return list(self._db.execute(sql, params))
            except sqlite3.DatabaseError as exc:
                raise _damaged(self.path, exc) from None

    def close(self) -> None:
        """Close the connection."""
        self._db.close()


def read_existing(directory: Path, sql: str, params: Sequence[object] = ()) -> list[sqlite3.Row] | None:
    """A read query on ``<directory>/brctl.db`` opened read-only, never creating it.

    None when there is no database or the query fails (e.g. a fresh database without
    the table): for readers that must not create state, such as the job's membership.
    """
    path = directory / DB_NAME
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return None
    try:
        db.row_factory = sqlite3.Row
        return list(db.execute(sql, params))
    except sqlite3.Error:
        return None
    finally:
        db.close()


def _private(path: Path) -> None:
    """Create the database file 0600 before SQLite does (it would follow the umask), and
    tighten one created looser; SQLite gives its -wal and -shm files the same mode.
    The records name machines, operators and reasons."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def _statements(sql: str) -> list[str]:
    """Split a migration script on ';' (migrations hold no ';' inside literals)."""
    return [s.strip() for s in sql.split(";") if s.strip()]
