"""Run a probe isolated, and job-writable code never as root by accident.

Node-side, standard library only. The probe bootstrap (``brctl.remote.probes``) is
run by the node's system ``python3 -I -S`` (no cwd, no ``PYTHONPATH``, no user site on
``sys.path``; ``site`` not run) from ``/`` and calls ``launch`` with the inventory's view
of the node:

- ``python``: the interpreter the probe must run under (``ssh.python``);
- ``paths``: the ``PYTHONPATH`` entries the node's ``env`` declares: the only
  import paths added (explicitly, after the interpreter's own), and their
  ``sitecustomize`` imported as Python would;
- ``user``: ``job.user`` or ``None``; ``as_job``: run as that user whatever the
  check says (replay's workload);
- ``module`` and ``args``: the probe; or ``exec``: an argv to run as ``user``.

Before any of that code runs, the interpreter (the path as configured, every
symlink on the way and the resolved binary, each with every directory above it;
its ``pyvenv.cfg``; its prefixes' ``lib/python3*`` and ``*-packages``) and every
declared entry must pass OpenSSH's StrictModes rule (``safefs.unsafe_owner_chain``)
for root and the invoking user, and so must the files Python runs by itself from
each of those directories (``sitecustomize``, ``usercustomize``, ``*.pth``, their
bytecode: ``startup_files``), and so must every directory a checked ``.pth`` file of
the interpreter adds to ``sys.path`` (``pth_directories``). What fails runs as ``job.user`` when that is set
and the path passes for root, the invoking user and the job user; otherwise the
node is refused: ``REFUSED_MARK`` and the reason on stdout, exit ``REFUSED_EXIT``.
A declared entry that does not exist is left out (Python ignores it too); one that
is not absolute is refused (it would depend on the cwd).

The node's declared ``env`` comes in the spec, not in front of the bootstrap (a ``PATH``
there picked the ``python3`` that runs this as root, ``LD_*`` what it loads): every
place it names passes the same rule (``declared_env.unsafe_env``: its ``PATH`` and
``LD_LIBRARY_PATH`` entries, every file the loader may load from a library directory,
the ``LD_PRELOAD``/``LD_AUDIT`` files, and what glibc's other variables make a program
load, parse or write: ``GCONV_PATH``, ``LOCPATH``, ``TZDIR``, ``MALLOC_TRACE``, ...); the
loader's and glibc's variables are set only for the program exec'd next (after
``setpriv``, which is taken from the login ``PATH`` and checked: it runs as root). Programs a probe runs
by name (``dcgmi``, ``py-spy``, ``dmesg``) pass the rule before they run (``vetted``).

The same rule then holds for every module the probe imports, as it is imported: a
root-owned 0755 entry (or site-packages) may still hold a file the job user owns (a
partial ``chown -R``), which it can rewrite. ``ImportGuard``, first on ``sys.meta_path``
of the process that runs the probe (this one, or the configured interpreter's), checks
the file each finder found before the module's code runs: the source, its cached
bytecode where there is one, bytecode without source, an extension module, a package's
``__init__``, each with every directory above it (``unsafe_owner_chain``, the allowed
owners of the launch decision: root and the invoking user, and the job user once the
run is that user's). Modules under the interpreter's standard library directory (where
``os`` is, not a ``sys.path`` entry below it such as ``site-packages``) and those read
from a zip (the probe code) are not checked per import. A failure is a refusal as above
(the module and the file named), at once and from any thread: the process exits
``REFUSED_EXIT`` without running the module, the probe's ``except`` clauses or exit
handlers.

Nothing of the interpreter runs before the guard either: the bootstrap and stage 2 start
with ``-S`` and ``enter`` runs ``site`` once the guard is in place, so the modules a
``.pth`` file's import line imports (``distutils-precedence.pth``: ``_distutils_hack``;
an editable install's finder), and what they import, are checked as they are imported
(the ``.pth`` file itself, code that ``site`` executes, passed ``check``); then
``sitecustomize`` is imported from the first path that has one, the declared entries
first, as with ``PYTHONPATH``. (A ``.pth`` line that ``exec``s a file it opens is beyond
this rule.) Python processes a probe starts (collective workers) are started by
``child_argv``: stage 2 under the same interpreter, isolated, with the same code,
declared entries and allowed owners; a refusal there is passed on as the probe's.
Replay's CUDA ranks, spawned by ``multiprocessing``, put the same guard in place before
they import anything of their own (``replay_workload._run_ranks``).

The user switch is ``setpriv --reuid --regid --init-groups``; the probe code then
reaches the job user through an inherited file descriptor (the cache under root's
home is not readable by it), copied for the run into a private temporary directory.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import importlib.machinery
import json
import os
import pwd
import runpy
import shutil
import site
import stat
import sys
import zipimport
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, NoReturn

from brctl.diagnostics.declared_env import deferred_env, unsafe_env, usable_env
from brctl.diagnostics.safefs import unsafe_owner_chain

REFUSED_EXIT = 96
REFUSED_MARK = "brctl-refused"
TRUSTED_PYTHON = "python3"  # the system interpreter that runs the checks (login PATH)

# Stage 2: the configured interpreter, started by launch() once it passed the checks
# (``-I -S``: enter() runs site once the guard is in place), and the probe's Python
# workers (``child_argv``). "fd:N" is root's cached zip handed to the job user as an open
# file: it is copied to a private directory of that user for this run, so that processes
# the probe starts (spawned ranks, collective workers) import it from a plain path.
STAGE2 = r"""
import atexit, json, os, shutil, sys, tempfile
code = sys.argv[1]
if code.startswith("fd:"):
    own = tempfile.mkdtemp(prefix="brctl-")
    atexit.register(shutil.rmtree, own, True)
    with os.fdopen(int(code[3:]), "rb") as src, open(os.path.join(own, "brctl.zip"), "wb") as dst:
        shutil.copyfileobj(src, dst)
    code = os.path.join(own, "brctl.zip")
else:
    own = None
sys.path.append(code)  # last until isolate is loaded: an installed brctl's site dir is unchecked
from brctl.diagnostics.isolate import enter
sys.path.remove(code)
sys.path.insert(0, code)
run = json.loads(sys.argv[2])
enter(run["paths"], sys.argv[3], sys.argv[4:], tuple(run["allowed"]), scratch=own)
"""


def interpreter_paths(python: str) -> list[str]:
    """What an interpreter runs: the path, its ``pyvenv.cfg`` and its prefixes' library dirs.

    Raises:
        FileNotFoundError: ``python`` is not on PATH.
    """
    found = python if "/" in python else shutil.which(python)
    if not found or not os.path.exists(found):
        raise FileNotFoundError(f"python {python!r}: not found" + ("" if found else " on PATH"))
    path = os.path.abspath(found)
    real = os.path.realpath(path)
    out = [path]
    prefixes = dict.fromkeys(os.path.dirname(os.path.dirname(p)) for p in (path, real))
    for base in dict.fromkeys([os.path.dirname(path), *prefixes]):
        cfg = os.path.join(base, "pyvenv.cfg")
        if os.path.lexists(cfg):
            out.append(cfg)
    for prefix in prefixes:
        for lib in sorted(glob.glob(os.path.join(prefix, "lib", "python3*"))):
            out.append(lib)
            out.extend(sorted(glob.glob(os.path.join(lib, "*-packages"))))
    return out


# What Python runs by itself from a directory on its path, before any probe code:
# site imports sitecustomize/usercustomize (a module, a package or their bytecode)
# and executes the import lines of a site directory's .pth files.
STARTUP_MODULES = ("sitecustomize", "usercustomize")


def _tree(top: str) -> list[str]:
    """Everything under the directory ``top`` (links listed, not followed), sorted per level."""
    out: list[str] = []
    for here, dirs, files in os.walk(top):
        dirs.sort()
        out.extend(os.path.join(here, n) for n in sorted(dirs + files))
    return out


def startup_files(directory: str) -> list[str]:
    """The files (and dirs) of ``directory`` that Python runs at startup, where present:
    ``sitecustomize``/``usercustomize`` in any form Python imports (``.py``, bytecode
    without source, an extension module, a package with everything in it), every
    ``*.pth``, and ``__pycache__`` with their bytecode. One listing per directory."""
    try:
        names = set(os.listdir(directory))
    except OSError:
        return []
    out = [os.path.join(directory, n) for n in sorted(
        n for n in names if n.endswith(".pth") or n.split(".", 1)[0] in STARTUP_MODULES)]
    for package in STARTUP_MODULES:
        if package in names and os.path.isdir(os.path.join(directory, package)):
            out.extend(_tree(os.path.join(directory, package)))
    if "__pycache__" in names:
        cache = os.path.join(directory, "__pycache__")
        out.append(cache)
        with contextlib.suppress(OSError):  # not a directory: its own check says so
            out.extend(os.path.join(cache, n) for n in sorted(os.listdir(cache))
                       if n.split(".", 1)[0] in STARTUP_MODULES and n.endswith(".pyc"))
    return out


def check(interpreter: Sequence[str], paths: Sequence[str], allowed: tuple[int, ...],
          env: Mapping[str, str] | None = None, *, job: bool = False) -> str | None:
    """The first reason the interpreter (``interpreter_paths``), an import path or code the
    declared ``env`` names may be written by others, or ``None``.

    Each path with every directory above it (StrictModes); in each directory among
    them (a ``PYTHONPATH`` entry, the interpreter's library and site directories)
    also the files Python runs from it at startup (``startup_files``): a root-owned
    0755 entry holding a job-writable ``sitecustomize.py`` is refused like a
    job-writable entry. From ``env`` (``usable_env``): every place it names, as
    ``declared_env.unsafe_env`` asks (``PATH`` entries, library directories with every file
    the loader may load from them, preloads, glibc's directories, files and where it writes;
    ``job``: the check for a run as the job user).
    """
    reason = unsafe_env(env or {}, allowed, job=job)
    if reason:
        return reason
    candidates = [("python", p) for p in interpreter]
    candidates += [("PYTHONPATH entry", p) for p in paths]
    for what, path in candidates:  # grows: the directories the interpreter's .pth files add
        reason = unsafe_owner_chain(path, allowed, sticky_ok=True)
        if reason:
            return f"{what} {path}: {reason}"
        if not os.path.isdir(path):
            continue
        for inside in startup_files(path):
            reason = unsafe_owner_chain(inside, allowed, sticky_ok=True)
            if reason:
                return f"{what} {path}: {reason} (Python runs it at startup)"
            if what == "python" and inside.endswith(".pth") and os.path.isfile(inside):
                candidates += [(f"directory added by {inside}", d) for d in pth_directories(inside)
                               if d not in (p for _, p in candidates)]
    return None


def pth_directories(pth: str) -> list[str]:
    """The directories ``site`` adds to ``sys.path`` from the (checked) ``.pth`` file ``pth``:
    every line but comments, blanks and ``import`` lines, relative to its directory, that exists.
    Python imports ``sitecustomize`` (and any module) from them too."""
    out = []
    with open(pth, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith(("#", "import ", "import\t")) or not line.strip():
                continue
            added = os.path.abspath(os.path.join(os.path.dirname(pth), line.rstrip()))
            if os.path.exists(added):
                out.append(added)
    return out


def usable_paths(declared: Sequence[str]) -> list[str]:
    """The declared entries that exist, in order (Python skips missing ones too).

    Decided once, before the check: an entry created after it is never added.
    """
    relative = [p for p in declared if p and not p.startswith("/")]
    if relative:
        refuse(f"PYTHONPATH entry {relative[0]!r} is not an absolute path")
    return [p for p in declared if p and os.path.lexists(p)]


def program(name: str, allowed: tuple[int, ...], search: str | None = None) -> str:
    """``name`` found on ``search`` (default ``PATH``) as an absolute path that passes the
    rule for ``allowed``; else refuse: a program brctl starts as root is as trusted as its code."""
    found = shutil.which(name, path=search)
    if not found:
        refuse(f"{name}: not found on PATH")
    found = os.path.abspath(found)
    reason = unsafe_owner_chain(found, allowed, sticky_ok=True)
    if reason:
        refuse(f"{name} {found}: {reason}; not run")
    return found


class ImportGuard:
    """A ``sys.meta_path`` finder: the other finders' answer, once its files pass the rule.

    ``find_spec`` asks the finders after it in turn, as the import system does, and
    checks the files of the spec found (``module_files``) with ``unsafe_owner_chain``
    for ``allowed``, unless they are the standard library's or in a zip; a failure ends
    the process with the refusal (``scratch``, a directory of this run, removed first).
    ``paths``: the run's declared entries, for the Python processes it starts (``child_argv``).
    """

    def __init__(self, allowed: Sequence[int], scratch: str | None = None,
                 paths: Sequence[str] = ()) -> None:
        self.allowed = tuple(allowed)
        self.scratch = scratch
        self.paths = list(paths)
        self.passed: set[str] = set()  # directories whose chain passed
        stdlib = getattr(sys, "_stdlib_dir", None)  # Python >= 3.11; else where os.py is
        if not stdlib and getattr(os, "__file__", None):
            stdlib = os.path.dirname(os.__file__)
        # Not known: nothing is taken for the stdlib (everything checked, slower, as safe).
        self.stdlib_dir = os.path.normpath(stdlib) if stdlib else None
        self.roots: list[tuple[str, bool]] = []
        self.seen: list[str] | None = None  # the sys.path self.roots was made from

    def stdlib(self, path: str) -> bool:
        """Whether ``path`` is in the standard library directory (below no other ``sys.path`` entry)."""
        if self.seen != sys.path:  # site, run after the guard, adds site-packages below it
            self.seen = list(sys.path)
            stdlib = self.stdlib_dir
            others = {os.path.normpath(p) for p in self.seen if p.startswith("/")} - {stdlib}
            # Longest first: site-packages under the stdlib directory is not the stdlib.
            self.roots = sorted([*([(stdlib, True)] if stdlib else []),
                                 *((p, False) for p in others)],
                                key=lambda r: len(r[0]), reverse=True)
        path = os.path.normpath(path)
        for root, stdlib in self.roots:
            if path == root or path.startswith(root.rstrip("/") + "/"):
                return stdlib
        return False

    def unsafe(self, path: str) -> str | None:
        """``unsafe_owner_chain(path, allowed, sticky_ok=True)``, each directory walked once:
        a directory that passed stays as it was (only allowed owners can change it)."""
        directory = os.path.dirname(path)
        if directory not in self.passed:
            reason = unsafe_owner_chain(directory, self.allowed, sticky_ok=True)
            if reason:
                return reason
            self.passed.add(directory)
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is None or stat.S_ISLNK(st.st_mode) or st.st_uid not in self.allowed or (
                st.st_mode & 0o022):
            return unsafe_owner_chain(path, self.allowed, sticky_ok=True)  # and its reason
        return None

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                self.vet(spec)
                return spec
        return None

    def vet(self, spec: importlib.machinery.ModuleSpec) -> None:
        """Refuse (end the process) if a file the import of ``spec`` runs fails the rule."""
        if isinstance(spec.loader, zipimport.zipimporter):
            return
        for path in module_files(spec):
            if self.stdlib(path):
                continue
            reason = self.unsafe(path)
            if reason:  # it names the path that failed: the file, or a directory above it
                where = "" if reason.startswith(path) else f" {path}"
                refuse_now(f"module {spec.name}{where}: {reason}; not imported", self.scratch)


def module_files(spec: importlib.machinery.ModuleSpec) -> list[str]:
    """The files importing ``spec`` runs: its origin (source, bytecode, extension module, a
    package's ``__init__``) and the cached bytecode of a source when that exists."""
    if not spec.has_location or not spec.origin:
        return []  # built-in, frozen, a namespace package (no code of its own)
    out = [spec.origin]
    try:
        cached = spec.cached
    except (NotImplementedError, ValueError):
        cached = None
    if cached and cached != spec.origin and os.path.lexists(cached):
        out.append(cached)
    return out


def guard_imports(allowed: Sequence[int], scratch: str | None = None,
                  paths: Sequence[str] = ()) -> ImportGuard:
    """Put an ``ImportGuard`` for ``allowed`` first on ``sys.meta_path`` (from now on,
    every module is checked as it is imported)."""
    guard = ImportGuard(allowed, scratch, paths)
    sys.meta_path.insert(0, guard)
    return guard


def running_guard() -> ImportGuard | None:
    """This process's ``ImportGuard`` (a probe started by ``launch``), or ``None``."""
    return next((f for f in sys.meta_path if isinstance(f, ImportGuard)), None)


def vetted(found: str | None) -> str | None:
    """``found``, a program this probe is about to run (``shutil.which``'s answer), once it
    passes the rule for the probe's allowed owners (``PATH`` may hold a root-owned directory
    with a job-owned file); a failure refuses the node (``refuse_now``). Outside a probe
    started by ``launch`` (run by hand), as it is."""
    guard = running_guard()
    if found is None or guard is None:
        return found
    found = os.path.abspath(found)
    reason = guard.unsafe(found)
    if reason:
        refuse_now(f"program {found}: {reason}; not run", guard.scratch)
    return found


def child_argv(module: str, args: Sequence[str]) -> list[str] | None:
    """The argv of a Python process that runs ``module`` as this probe runs, or ``None``
    outside a probe started by ``launch`` (no ``ImportGuard`` here).

    The same interpreter, isolated (``-I -S``, from stage 2): this probe code, the declared
    entries and the interpreter's own paths, site run after the guard, the same allowed
    owners; the declared ``sitecustomize`` imported. Its refusal is its own (``REFUSED_MARK``
    on its stdout, ``REFUSED_EXIT``): the caller passes it on (``refuse_now``).
    """
    guard = running_guard()
    if guard is None:
        return None
    # Where this module was imported from: the cached zip, this run's copy, an installed brctl.
    code = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = {"paths": guard.paths, "allowed": list(guard.allowed)}
    return [sys.executable, "-I", "-S", "-c", STAGE2, code, json.dumps(run), module, *args]


def enter(paths: Sequence[str], module: str, args: Sequence[str],
          allowed: Sequence[int], *, scratch: str | None = None) -> None:
    """Add the checked import paths, guard every import (``allowed``: the uids the launch
    decision allowed), import their ``sitecustomize`` as Python would, run ``module``.

    Started with ``-S`` (stage 2, the bootstrap): ``site`` runs here, after the guard, so
    what it imports (``.pth`` import lines, ``sitecustomize``, from the declared entries
    first, as with ``PYTHONPATH``) is checked too. ``scratch``: this run's private copy of
    the probe code, removed on a refusal.
    """
    sys.path[1:1] = list(paths)  # after the probe code, before the interpreter's own
    sys.argv = [module, *args]  # what site and sitecustomize see, in this process or stage 2
    guard_imports(allowed, scratch, paths)
    if sys.flags.no_site:
        site.main()
    elif paths and importlib.machinery.PathFinder.find_spec("sitecustomize", list(paths)):
        sys.modules.pop("sitecustomize", None)
        try:
            importlib.import_module("sitecustomize")
        except Exception as exc:  # as site.py: report, carry on
            sys.stderr.write(f"Error in sitecustomize; {type(exc).__name__}: {exc}\n")
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def refuse(reason: str) -> NoReturn:
    """Answer ``refused`` with ``reason`` (the controller makes it the node's state)."""
    sys.stdout.write(f"{REFUSED_MARK} {json.dumps(reason)}\n")
    sys.stdout.flush()
    sys.exit(REFUSED_EXIT)


def refuse_now(reason: str, scratch: str | None = None) -> NoReturn:
    """``refuse`` from inside the probe (an import, any thread): no exception it could
    catch, no exit handler run; only ``scratch`` (this run's code copy) is removed."""
    try:
        sys.stderr.flush()
        sys.stdout.write(f"{REFUSED_MARK} {json.dumps(reason)}\n")
        sys.stdout.flush()
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        os._exit(REFUSED_EXIT)


def _as_user(account: pwd.struct_passwd, argv: list[str], deferred: Mapping[str, str],
             search: str | None, mine: tuple[int, ...]) -> NoReturn:
    """Exec ``argv`` as ``account`` through ``setpriv`` (found on ``search``, the login
    ``PATH``, and passing the rule for ``mine``: it runs as root); ``deferred`` (the loader's
    and glibc's variables) once it is that user."""
    setpriv = program("setpriv", mine, search)
    os.environ.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
    sys.stdout.flush()
    sys.stderr.flush()
    then = [program("env", mine, search), *(f"{k}={v}" for k, v in deferred.items())] if deferred else []
    try:
        os.execv(setpriv, [setpriv, f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
                           "--init-groups", "--", *then, *argv])
    except OSError as exc:
        refuse(f"cannot run as job.user {account.pw_name!r}: setpriv: {exc.strerror}")


def launch(spec: dict[str, Any], code: str) -> None:
    """Check, then run the probe here, under the configured interpreter, or as ``job.user``.

    ``code`` is where this probe code was found (the cached zip or an installed brctl).
    The node's declared ``env`` (``spec["env"]``, not applied by the transport: see
    ``brctl.core.transport.with_env``) is applied here: the loader's and glibc's variables
    (``deferred_env``) only to the program exec'd once what they name passed the check, the rest at once (a
    ``PATH`` entry is checked before any program is found on it).
    """
    os.chdir("/")
    mine = tuple(sorted({0, os.getuid()}))
    login_path = os.environ.get("PATH")
    try:
        env = usable_env(spec.get("env", {}))
    except ValueError as exc:
        refuse(str(exc))
    deferred = deferred_env(env)
    os.environ.update({k: v for k, v in env.items() if k not in deferred})
    user = spec.get("user")
    account = None
    if user:
        try:
            account = pwd.getpwnam(user)
        except KeyError:
            refuse(f"job.user {user!r}: no such user on this machine")
    if "exec" in spec:  # an argv the operator gave, to run as the job user
        if account is None:
            refuse("exec as the job user needs job.user")
        _as_user(account, list(spec["exec"]), deferred, login_path, mine)
    python, paths = spec["python"], usable_paths(spec.get("paths", []))
    try:
        interpreter = interpreter_paths(python)  # looked up once: checked, and exec'd by its path
        reason = check(interpreter, paths, mine, env)
    except FileNotFoundError as exc:  # no interpreter: a failure, as exec would fail
        sys.stderr.write(f"brctl: {exc}\n")
        sys.exit(127)
    exe = interpreter[0]
    drop = bool(spec.get("as_job")) and account is not None
    if reason:
        if account is None:
            refuse(f"{reason}; not run as root (set job.user to run it as the job's user)")
        again = check(interpreter, paths, (*mine, account.pw_uid), env, job=True)
        if again:
            refuse(f"{again}; not even the job user {user!r} may run it")
        drop = True
    # Whose files the probe may import: as decided for the interpreter and the entries.
    allowed = tuple(sorted({*mine, account.pw_uid})) if drop and account is not None else mine
    if exe == sys.executable and not drop and not deferred:  # this interpreter (a venv's differs)
        enter(paths, spec["module"], spec.get("args", []), allowed)
        return
    if drop and os.path.isfile(code):  # root's cache is not readable by the job user
        fd = os.open(code, os.O_RDONLY)
        os.set_inheritable(fd, True)
        code = f"fd:{fd}"
    run = {"paths": paths, "allowed": allowed}
    argv = [exe, "-I", "-S", "-c", STAGE2, code, json.dumps(run), spec["module"],
            *spec.get("args", [])]
    if drop:
        assert account is not None
        _as_user(account, argv, deferred, login_path, mine)
    sys.stdout.flush()
    os.environ.update(deferred)
    os.execv(exe, argv)
