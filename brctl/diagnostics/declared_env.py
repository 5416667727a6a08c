"""The node's declared ``env``: what it makes programs run or load, and how it is applied.

Node-side, standard library only; used by ``brctl.diagnostics.isolate.launch``, which
gets the env in the probe's request (the transports do not put it in front of brctl's
own node programs: ``brctl.core.transport.with_env``). ``PATH`` picks the programs found
by name; the dynamic loader's ``LD_LIBRARY_PATH``, ``LD_PRELOAD`` and ``LD_AUDIT`` the
code loaded into every program started with them (``loader_env``: set only for the
program exec'd next). ``usable_env`` fixes what is applied (existing, absolute entries),
``env_code`` lists what ``isolate.check`` must find safe, and ``library_dir`` what a
library directory lets the loader load.
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
_SEPARATORS = {"PATH": ":", "LD_LIBRARY_PATH": "[:;]", "LD_PRELOAD": "[: ]", "LD_AUDIT": ":"}


def usable_env(declared: Mapping[str, str]) -> dict[str, str]:
    """The node's declared ``env`` as it is applied: ``PATH`` and ``LD_LIBRARY_PATH`` keep
    the entries that exist, ``LD_PRELOAD``/``LD_AUDIT`` the files named by a path that exist
    (bare names are looked up in the library path); decided once, before the check, so a
    directory or file created after it is never used.

    Raises:
        ValueError: a relative entry, or a loader token (``$LIB``) in an ``LD_*`` one.
    """
    env = dict(declared)
    for key in (*SEARCH_PATHS, *PRELOADS):
        if key not in env:
            continue
        items = [p for p in re.split(_SEPARATORS[key], env[key]) if p]
        relative = [p for p in items if not p.startswith("/") and (key in SEARCH_PATHS or "/" in p)]
        if relative:
            raise ValueError(f"{key} entry {relative[0]!r} is not an absolute path")
        tokens = [p for p in items if "$" in p and key != "PATH"]
        if tokens:  # $LIB, $PLATFORM, $ORIGIN: the loader's to expand, not checkable here
            raise ValueError(f"{key} entry {tokens[0]!r} uses a loader token: write the path out")
        env[key] = ":".join(p for p in items if not p.startswith("/") or os.path.lexists(p))
    return env


def env_code(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """What ``env`` (``usable_env``) makes programs run or load, as (what, path)."""
    out = [(f"{key} entry", p) for key in SEARCH_PATHS for p in env.get(key, "").split(":") if p]
    return out + [(f"{key} file", p) for key in PRELOADS
                  for p in env.get(key, "").split(":") if p.startswith("/")]


def loader_env(env: Mapping[str, str]) -> dict[str, str]:
    """The dynamic loader's variables (``LD_*``): set only for the program exec'd next."""
    return {k: v for k, v in env.items() if k.startswith("LD_")}


# Subdirectories of a library directory the loader searches too: glibc-hwcaps
# (glibc >= 2.33) and the legacy hwcaps and platform directories (before 2.37).
LOADER_SUBDIRS = ("glibc-hwcaps", "tls", "x86_64", "haswell", "avx512_1", "xeon_phi", "i686",
                  "i586", "aarch64", "atomics", "power8", "power9", "power10", "z13", "z14", "z15")


def searched(directory: str) -> tuple[list[str], list[str]]:
    """The directories the loader searches from the library directory ``directory`` (it,
    and everything below its ``LOADER_SUBDIRS``, links followed as the loader does) and
    every entry of those: what it may load."""
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
        except OSError:
            continue
        for name in names:
            entry = os.path.join(here, name)
            entries.append(entry)
            if (here != directory or name in LOADER_SUBDIRS) and os.path.isdir(entry):
                todo.append(entry)
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


def library_dir(path: str, allowed: tuple[int, ...]) -> str | None:
    """Why the library directory ``path`` (an ``LD_LIBRARY_PATH`` entry, its own chain
    checked by the caller) may make the loader load code others wrote, or ``None``: an
    entry of what it searches (``searched``) fails the rule, or one of those directories
    is writable by others (sticky or not: a name added after this check would be loaded)."""
    dirs, entries = searched(path)
    for inside in entries:
        reason = (_dangling(inside, allowed) if not os.path.exists(inside)
                  else unsafe_owner_chain(inside, allowed, sticky_ok=True))
        if reason:
            return f"{reason} (the loader may load it)"
    for here in dirs:
        mode = os.stat(here).st_mode & 0o7777
        if mode & 0o022:
            return (f"{here} is group/other writable (mode {mode:04o}): "
                    "a library added after this check would be loaded")
    return None
