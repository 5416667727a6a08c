"""The node's declared ``env``: what it makes programs run, load, read or write, and how it
is applied.

Node-side, standard library only; used by ``brctl.diagnostics.isolate.launch``, which
gets the env in the probe's request (the transports do not put it in front of brctl's
own node programs: ``brctl.core.transport.with_env``). ``PATH`` picks the programs found
by name; the dynamic loader's ``LD_LIBRARY_PATH``, ``LD_PRELOAD`` and ``LD_AUDIT`` the
code loaded into every program started with them; glibc's other variables that name a
place (the ones it ignores itself in setuid programs) what a program loads (``GCONV_PATH``'s
modules, ``GETCONF_DIR``'s programs), parses (``LOCPATH``, ``TZDIR``, ``NLSPATH``,
``HOSTALIASES``, ``RESOLV_HOST_CONF``) or writes (``MALLOC_TRACE``, ``LD_DEBUG_OUTPUT``,
``LD_PROFILE_OUTPUT``, ``TMPDIR``). ``usable_env`` fixes what is applied (existing,
absolute entries), ``unsafe_env`` is what ``isolate.check`` asks of it (``env_code``: the
places it names), ``deferred_env`` what is set only for the program exec'd next (the
loader's and glibc's variables: never for ``setpriv``, root, on the way to the job user).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from brctl.diagnostics.safefs import unsafe_owner_chain

# The declared env's lists of code: PATH (programs found by name), the dynamic loader's
# library path and the libraries it loads into every program started with them.
SEARCH_PATHS = ("PATH", "LD_LIBRARY_PATH")
PRELOADS = ("LD_PRELOAD", "LD_AUDIT")
# glibc's variables that name a place (unsecvars.h): directories whose whole tree a program
# may load or parse; files it reads; where it writes (a file, or LD_PROFILE_OUTPUT's
# directory; TMPDIR's new files are made O_EXCL, so a sticky one like /tmp is fine).
TREES = ("GCONV_PATH", "LOCPATH", "NLSPATH", "TZDIR", "GETCONF_DIR")
READ = ("HOSTALIASES", "RESOLV_HOST_CONF", "TZ")  # TZ: where it names a file (":/x", "/x")
WRITTEN = ("MALLOC_TRACE", "LD_DEBUG_OUTPUT", "LD_PROFILE_OUTPUT")
PROFILE_DEFAULT = "/var/tmp"  # where LD_PROFILE writes without LD_PROFILE_OUTPUT
TEMP = "TMPDIR"
# The rest of glibc's list names nothing: values the operator chose (applied like the
# others, after setpriv: glibc ignores them in root's setuid programs for a reason).
GLIBC_UNSECURE = (*TREES, *READ, *WRITTEN, TEMP, "GLIBC_TUNABLES", "LOCALDOMAIN", "RES_OPTIONS",
                  "NIS_PATH")
# Locale names, which glibc and gettext join to their directories: a '/' in one reaches
# outside them (LC_ALL=../../home/job/x), so none may hold one.
LOCALE_NAMES = ("LANG", "LANGUAGE")
_SEPARATORS = {"PATH": ":", "LD_LIBRARY_PATH": "[:;]", "LD_PRELOAD": "[: ]", "LD_AUDIT": ":",
               "GCONV_PATH": ":", "LOCPATH": ":", "NLSPATH": ":"}
_NAMED = (*SEARCH_PATHS, *PRELOADS, *TREES, *READ, *WRITTEN, TEMP)  # in the order checked
_FILES = (*PRELOADS, *READ, "MALLOC_TRACE", "LD_DEBUG_OUTPUT")  # "X file", not "X entry"
MAX_ENTRIES = 20000  # a tree with more below it (LOCPATH=/) is refused, not walked whole


def usable_env(declared: Mapping[str, str]) -> dict[str, str]:
    """The node's declared ``env`` as it is applied: a list of places keeps the entries that
    exist, ``LD_PRELOAD``/``LD_AUDIT`` the files named by a path that exist (bare names are
    looked up in the library path), a place read or a temporary directory is dropped when
    missing; decided once, before the check, so what is created after it is never used.
    Where a program writes (``WRITTEN``) need not exist yet: without its directory the
    variable is dropped. A ``TZ`` names a file when it is a path (``:/x``, ``/x``); a zone
    name or rule (``Europe/Paris``, ``BRT-9``) is kept as it is.

    Raises:
        ValueError: a relative path, a loader token (``$LIB``) in an ``LD_*`` entry, a
            ``..`` in an ``NLSPATH`` template or a ``TZ``, a ``/`` in a locale name, a NUL.
    """
    env = _values(declared)
    for key in _NAMED:
        if key not in env or (key == "TZ" and not env[key].startswith("/")):
            continue
        items = [p for p in (re.split(_SEPARATORS[key], env[key]) if key in _SEPARATORS else [env[key]]) if p]
        if key == "NLSPATH" and any(".." in p.split("/") for p in items):
            raise ValueError("NLSPATH template reaches outside its directory ('..')")
        relative = [p for p in items if not p.startswith("/") and (key not in PRELOADS or "/" in p)]
        if relative:
            what = "file" if key in _FILES else "entry"
            raise ValueError(f"{key} {what} {relative[0]!r} is not an absolute path")
        tokens = [p for p in items if "$" in p and key.startswith("LD_")]
        if tokens:  # $LIB, $PLATFORM, $ORIGIN: the loader's to expand, not checkable here
            raise ValueError(f"{key} entry {tokens[0]!r} uses a loader token: write the path out")
        if key not in WRITTEN:
            items = [p for p in items if not p.startswith("/") or os.path.lexists(_place(key, p))]
        elif not os.path.isdir(_written_dir(key, items[0]) if items else ""):
            items = []  # nowhere to write: the program writes nothing
        if key in _SEPARATORS:
            env[key] = ":".join(items)
        elif items:
            env[key] = items[0]
        else:
            del env[key]
    return env


def _values(declared: Mapping[str, str]) -> dict[str, str]:
    """``declared`` with a ``TZ`` file written as its path; raises ValueError for a value
    no program may be given (a NUL), a locale name with a ``/``, a ``TZ`` with ``..``."""
    env = dict(declared)
    for key, value in env.items():
        if "\0" in key or "\0" in value:
            raise ValueError(f"env {key!r}: a NUL byte cannot be passed to a program")
        if (key in LOCALE_NAMES or key.startswith("LC_")) and "/" in value:
            raise ValueError(f"{key} {value!r} is a locale name, not a path: it may not hold '/'")
    tz = env.get("TZ", "")
    if ".." in tz.split("/"):
        raise ValueError(f"TZ {tz!r} reaches outside the zone directory ('..')")
    if tz.lstrip(":").startswith("/"):
        env["TZ"] = tz.lstrip(":")  # glibc reads ":/x" and "/x" alike: the file
    return env


def _written_dir(key: str, path: str) -> str:
    """The directory a ``WRITTEN`` variable's program writes into (``LD_DEBUG_OUTPUT``'s
    file gets ``.PID`` added)."""
    return path if key == "LD_PROFILE_OUTPUT" else os.path.dirname(path)


def _place(key: str, item: str) -> str:
    """The path an entry of ``key`` names: an ``NLSPATH`` template's directory (up to its
    first ``%`` component, ``/usr/share/locale/%L/%N.cat``), else the entry."""
    if key != "NLSPATH" or "%" not in item:
        return item
    head = item[:item.index("%")]
    return head[:head.rindex("/")] or "/"


def env_code(env: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """The places ``env`` (``usable_env``) names, as (key, what, path), in ``_NAMED``'s order."""
    out = []
    for key in _NAMED:
        for item in re.split(_SEPARATORS.get(key, "\0"), env.get(key, "")):
            if item.startswith("/"):  # a bare LD_PRELOAD name is found in the library path
                out.append((key, f"{key} {'file' if key in _FILES else 'entry'}", _place(key, item)))
    if "LD_PROFILE" in env and "LD_PROFILE_OUTPUT" not in env:
        out.append(("LD_PROFILE_OUTPUT", "LD_PROFILE's output directory", PROFILE_DEFAULT))
    return out


def unsafe_env(env: Mapping[str, str], allowed: tuple[int, ...], *, job: bool = False) -> str | None:
    """The first reason a place ``env`` (``usable_env``) names may be written by others, or
    ``None``. Each path with every directory above it (StrictModes, sticky directories
    allowed); a library directory's files and those of its ``LOADER_SUBDIRS``, and a
    ``TREES`` directory's whole tree, too (``library_dir``); where a program writes, its
    directory may not be writable by others (sticky or not: a name they make first, a link
    to ``/etc/shadow``, would be written as root) and the file itself passes where it
    exists. ``job``: the check for a run as the job user, whose files a sticky directory
    (``/tmp``) may hold: what others made there is that user's business, not root's."""
    for key, what, path in env_code(env):
        if key in WRITTEN:
            reason = _written(key, path, allowed, job)
        else:
            reason = unsafe_owner_chain(path, allowed, sticky_ok=True)
            if not reason and key == "LD_LIBRARY_PATH":
                reason = library_dir(path, allowed)
            elif not reason and key in TREES:
                reason = library_dir(path, allowed, subdirs=None, because="read from it")
        if reason:
            return f"{what} {path}: {reason}"
    return None


def _written(key: str, path: str, allowed: tuple[int, ...], job: bool) -> str | None:
    """Why a program may not write ``path`` (a ``WRITTEN`` variable's) as ``unsafe_env``
    says, or ``None``. The directory's mode is read only once its chain passed: only the
    allowed owners can then replace it (a job user's race no longer ends in a traceback)."""
    here = _written_dir(key, path)
    reason = unsafe_owner_chain(here, allowed, sticky_ok=True)
    if reason:
        return reason
    mode = os.stat(here).st_mode & 0o7777
    if mode & 0o022 and not (job and mode & 0o1000):
        return f"{here} is group/other writable (mode {mode:04o}): others may make the name first"
    if here != path and os.path.lexists(path):
        return unsafe_owner_chain(path, allowed, sticky_ok=True)
    return None


def deferred_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables set only for the program exec'd next: the loader's (``LD_*``) and
    glibc's others (``GLIBC_UNSECURE``), which steer what a program loads, reads or writes."""
    return {k: v for k, v in env.items() if k.startswith("LD_") or k in GLIBC_UNSECURE}


# Subdirectories of a library directory the loader searches too: glibc-hwcaps
# (glibc >= 2.33) and the legacy hwcaps and platform directories (before 2.37).
LOADER_SUBDIRS = ("glibc-hwcaps", "tls", "x86_64", "haswell", "avx512_1", "xeon_phi", "i686",
                  "i586", "aarch64", "atomics", "power8", "power9", "power10", "z13", "z14", "z15")


def searched(directory: str, subdirs: tuple[str, ...] | None = LOADER_SUBDIRS
             ) -> tuple[list[str], list[str]]:
    """The directories the loader searches from the library directory ``directory`` (it,
    and everything below its ``subdirs``, or below all of them for None; links followed as
    the loader does) and every entry of those: what it may load. At most ``MAX_ENTRIES``
    entries and one more: a tree that big is not walked to its end."""
    dirs, entries, seen, todo = [], [], set(), [directory]
    while todo:
        here = todo.pop()
        real = os.path.realpath(here)
        if real in seen:
            continue
        seen.add(real)
        dirs.append(here)
        try:
            names = sorted(os.listdir(here))
        except PermissionError:
            raise  # what it holds cannot be known: the caller refuses it
        except OSError:
            continue
        for name in names:
            entry = os.path.join(here, name)
            entries.append(entry)
            if (here != directory or subdirs is None or name in subdirs) and os.path.isdir(entry):
                todo.append(entry)
        if len(entries) > MAX_ENTRIES:
            break
    return dirs, entries


def _dangling(link: str, allowed: tuple[int, ...]) -> str | None:
    """Why the link ``link``, whose target does not exist (a stale ``libfoo.so``), may come
    to name code others wrote: it, or the nearest existing directory on its target's way
    (where the target could be created), fails the rule or is writable by others."""
    try:
        if os.lstat(link).st_uid not in allowed:
            return unsafe_owner_chain(link, allowed, sticky_ok=True)
    except OSError as exc:
        return f"{link}: {exc.strerror}"
    here = os.path.dirname(os.path.realpath(link))
    while not os.path.isdir(here):
        here = os.path.dirname(here)
    reason = unsafe_owner_chain(here, allowed, sticky_ok=True)
    mode = os.stat(here).st_mode & 0o7777
    if not reason and mode & 0o022:
        reason = f"{here} is group/other writable (mode {mode:04o})"
    return f"{reason}, where {link} points" if reason else None


def library_dir(path: str, allowed: tuple[int, ...], subdirs: tuple[str, ...] | None = LOADER_SUBDIRS,
                because: str = "the loader may load it") -> str | None:
    """Why the library directory ``path`` (an ``LD_LIBRARY_PATH`` entry, its own chain
    checked by the caller; with ``subdirs`` None, any directory read whole, a ``TREES``
    one) may make a program load code others wrote, or ``None``: an entry of what it
    searches (``searched``) fails the rule, or one of those directories is writable by
    others (sticky or not: a name added after this check would be loaded)."""
    try:
        dirs, entries = searched(path, subdirs)
    except PermissionError as exc:
        return f"{exc.filename}: {exc.strerror}: what it holds cannot be checked"
    if len(entries) > MAX_ENTRIES:
        return f"more than {MAX_ENTRIES} entries below it: too many to check"
    for inside in entries:
        reason = (_dangling(inside, allowed) if not os.path.exists(inside)
                  else unsafe_owner_chain(inside, allowed, sticky_ok=True))
        if reason:
            return f"{reason} ({because})"
    for here in dirs:
        mode = os.stat(here).st_mode & 0o7777
        if mode & 0o022:
            return (f"{here} is group/other writable (mode {mode:04o}): "
                    "a file added after this check would be used")
    return None
