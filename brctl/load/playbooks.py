"""Find and read the playbooks (``playbooks/*.yaml``).

Search path (``playbook_dirs``): the built-in set (``brctl.load.resources.data_dir``: the
installed share dir ``<prefix>/share/brctl/playbooks``, else the checkout's
``playbooks/``), then ``$BRCTL_PLAYBOOKS``, then ``--playbooks DIR``. A user directory
extends the built-in set; a user playbook with the same ``name`` replaces the
built-in one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import yaml

from brctl.analysis.playbook import Playbook, parse_playbook
from brctl.core.errors import InputError
from brctl.load.resources import data_dir


def playbook_dirs(explicit: str | None, environ: Mapping[str, str],
                  builtin: Callable[[str], Path | None] = data_dir) -> list[Path]:
    """The directories to load, in order (later ones override earlier names).

    Args:
        explicit: ``--playbooks DIR``, or None.
        environ: the environment (``$BRCTL_PLAYBOOKS``).
        builtin: finds the shipped playbooks (``brctl.load.resources.data_dir``; tests
            pass their own).

    Raises:
        InputError: an explicitly named directory does not exist.
    """
    shipped = builtin("playbooks")
    dirs = [shipped] if shipped is not None else []
    for value, origin in ((environ.get("BRCTL_PLAYBOOKS"), "$BRCTL_PLAYBOOKS"),
                          (explicit, "--playbooks")):
        if value:
            path = Path(value).expanduser()
            if not path.is_dir():
                raise InputError(f"{origin} {value}: no such directory")
            dirs.append(path)
    return dirs


def load_file(path: Path) -> Playbook:
    """Read and validate one playbook file (exit 2 naming file and key when bad)."""
    source = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"playbook {source}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        raise InputError(f"playbook {source}:{where} malformed YAML: "
                         f"{getattr(exc, 'problem', None) or exc}") from None
    return parse_playbook(data, source)


def load_playbooks(dirs: Sequence[Path]) -> list[Playbook]:
    """Every ``*.yaml`` of ``dirs`` (sorted by file name per directory), later dirs winning.

    Raises:
        InputError: a bad playbook, or two files of one directory with the same name.
    """
    books: dict[str, Playbook] = {}
    for directory in dirs:
        seen: dict[str, Path] = {}
        for path in sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml")):
            book = load_file(path)
            if book.name in seen:
                raise InputError(f"playbook {path}: name {book.name!r} is also used by {seen[book.name]}")
            seen[book.name] = path
            books.pop(book.name, None)
            books[book.name] = book
    if not books:
        where = ", ".join(map(str, dirs)) or "no directory (the shipped playbooks are missing)"
        raise InputError(f"no playbooks found in {where}",
                         hint="reinstall brctl, or pass --playbooks DIR")
    return list(books.values())
