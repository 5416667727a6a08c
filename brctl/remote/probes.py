"""Run brctl's node-side probes on nodes that have only ``python3``.

The probe code (``brctl/__init__.py`` and ``brctl/diagnostics/``) is packed into a
deterministic zip named by its sha256. On the node, a bootstrap run by the system
``python3 -I -S`` (isolated: neither the cwd nor ``PYTHONPATH`` nor the user site is on
``sys.path``; ``site``, whose ``.pth`` files import modules, runs only once ``launch``
guards imports) uses ``~/.cache/brctl/<sha256>/brctl.zip`` when its hash matches, else
an installed brctl of exactly the controller's version in the interpreter's site
directories whose package (every file and directory, and every directory above it)
only root and this user can change (``_UNSHARED``), else answers "missing"; the
controller then ships the zip once over the same connection (written to a temp
name, checked, renamed: atomic) and runs the probe again. ``bytes_shipped`` counts
what was sent. The cache is used, and written, only where root and this user alone
can change it (``_UNSHARED``): elsewhere a file could be swapped between its hash
check and its import or run; the node then fails, naming the path. Other files
(e.g. a py-spy binary) are shipped and cached the same way with ``ensure_file``.

The bootstrap then hands over to ``brctl.diagnostics.isolate.launch``: from ``/``,
it checks the node's ``python`` and the ``PYTHONPATH`` entries its ``env`` declares
(StrictModes), and runs the probe under that interpreter with exactly those extra
import paths, as ``job.user`` where job-writable code needs it, or answers
``refused`` (the node's state then).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import threading
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import brctl
from brctl.core.transport import Node, NodeState, Results, RunResult, Transport, node_program
from brctl.diagnostics.isolate import REFUSED_EXIT, REFUSED_MARK
from brctl.remote.fanout import run_all

PROBE_DOC_MAX = 4 << 20  # a probe's answer larger than this is refused (a broken or hostile node)
MISSING_EXIT = 97  # the bootstrap's "ship me the bundle" answer
MISSING_MARK = "brctl-bundle-missing"

# The cache is used only where nobody but root and this user can change it (OpenSSH's
# StrictModes, from / down; a root-owned sticky directory such as /tmp may be on the way):
# else another user could swap a file between its hash check and its import or run.
_UNSHARED = r"""
import os
def unshared(path):
    uid, real = os.geteuid(), os.path.realpath(path)
    top = real
    while True:
        try:
            st = os.stat(real)
        except OSError as exc:
            return "%s: %s" % (real, exc.strerror)
        sticky = real != top and st.st_uid in (0, uid) and st.st_mode & 0o1000
        if st.st_uid not in (0, uid) or (st.st_mode & 0o022 and not sticky):
            return "%s may be changed by others (owner uid %d, mode %o)" % (
                real, st.st_uid, st.st_mode & 0o7777)
        if real == "/":
            return ""
        real = os.path.dirname(real)
"""

_BOOTSTRAP = _UNSHARED + r"""
import hashlib, json, os, sys
digest, version, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
os.chdir("/")
zpath = os.path.join(os.path.expanduser("~"), ".cache", "brctl", digest, "brctl.zip")
def _matches(path):
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest() == digest
    except OSError:
        return False
if not unshared(zpath) and _matches(zpath):
    code = zpath
    sys.path.insert(0, code)
else:
    # An installed brctl: found without running anything (-S: site has not run, so only
    # the interpreter's site directories, a venv's first), imported only if nobody but
    # root and this user can change a file or directory of its package.
    import importlib.machinery, site
    found = importlib.machinery.PathFinder.find_spec("brctl", site.getsitepackages(
        [os.path.dirname(os.path.dirname(os.path.abspath(sys.executable))), sys.prefix]))
    package = list(found.submodule_search_locations or [])[:1] if found else []
    tree = package + [os.path.join(here, n) for top in package
                      for here, dirs, files in os.walk(top) for n in dirs + files]
    # A linked directory's files are not walked: not used.
    usable = bool(package) and not any(
        unshared(p) or (os.path.islink(p) and os.path.isdir(p)) for p in tree)
    if usable:
        # Last on sys.path while brctl and what isolate imports load: the site directory
        # is not checked, its files must not shadow the standard library's; first once
        # they are (launch adds the declared entries after it, then guards imports).
        code = os.path.dirname(package[0])
        sys.path.append(code)
        try:
            import brctl
            usable = getattr(brctl, "__version__", None) == version
        except ImportError:
            usable = False
    if not usable:
        sys.stdout.write("%s\n" % "MARK")
        sys.exit(CODE)
    import brctl.diagnostics.isolate
    sys.path.remove(code)
    sys.path.insert(0, code)
from brctl.diagnostics.isolate import launch
launch(spec, code)
""".replace("MARK", MISSING_MARK).replace("CODE", str(MISSING_EXIT))

_INSTALLER = _UNSHARED + r"""
import hashlib, os, sys, tempfile
digest, name, mode = sys.argv[1], sys.argv[2], int(sys.argv[3], 8)
data = sys.stdin.buffer.read()
if hashlib.sha256(data).hexdigest() != digest:
    sys.stderr.write("brctl: shipped %s arrived corrupted (sha256 mismatch)\n" % name)
    sys.exit(1)
base = os.path.join(os.path.expanduser("~"), ".cache", "brctl", digest)
os.makedirs(base, mode=0o700, exist_ok=True)
why = unshared(base)
if why:
    sys.stderr.write("brctl: not caching %s in %s: %s\n" % (name, base, why))
    sys.exit(1)
fd, tmp = tempfile.mkstemp(dir=base, prefix=".partial-")
with os.fdopen(fd, "wb") as fh:
    fh.write(data)
    fh.flush()
    os.fsync(fh.fileno())
os.chmod(tmp, mode)
os.replace(tmp, os.path.join(base, name))
sys.stdout.write(os.path.join(base, name) + "\n")
"""

_CHECK_FILE = _UNSHARED + r"""
import hashlib, os, sys
digest, name = sys.argv[1], sys.argv[2]
path = os.path.join(os.path.expanduser("~"), ".cache", "brctl", digest, name)
try:
    with open(path, "rb") as fh:
        ok = not unshared(path) and hashlib.sha256(fh.read()).hexdigest() == digest
except OSError:
    ok = False
sys.stdout.write((path if ok else "") + "\n")
"""


@dataclass(frozen=True)
class Bundle:
    """Bytes to cache on nodes under ``~/.cache/brctl/<digest>/<name>``."""

    name: str
    data: bytes
    mode: int = 0o644

    @property
    def digest(self) -> str:
        """sha256 of the content: the cache key."""
        return hashlib.sha256(self.data).hexdigest()


def probe_bundle(package_dir: Path | None = None) -> Bundle:
    """A deterministic zip of the node-side code (same bytes for the same sources)."""
    root = package_dir or Path(brctl.__file__).parent
    files = [root / "__init__.py", *sorted((root / "diagnostics").rglob("*.py"))]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in files:
            arcname = "brctl/" + path.relative_to(root).as_posix()
            info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, path.read_bytes())
    return Bundle("brctl.zip", buf.getvalue())


@dataclass(frozen=True)
class ProbeResult:
    """One node's probe outcome: the transport result and the parsed document (or why not)."""

    node: str
    run: RunResult
    document: dict[str, Any] | None
    error: str | None

    @property
    def ok(self) -> bool:
        """A document came back."""
        return self.document is not None


Request = Union[Mapping[str, Any], Callable[[Node], Mapping[str, Any]]]


def _clip(text: str, keep: int = 600) -> str:
    """``text``, or its head and tail around " … " when longer than ``keep``: a reason names
    what it refused first (a variable, a path) and why last, and a cut at either end lost one
    (a refusal naming two long paths came back as "ATH entry ..." or without its verdict)."""
    if len(text) <= keep:
        return text
    return f"{text[:keep // 2]} … {text[-(keep // 2):]}"


class NotFinite(ValueError):
    """A node's JSON holds ``NaN``, ``Infinity`` or ``-Infinity`` (not JSON numbers)."""


def _not_finite(name: str) -> Any:
    raise NotFinite(f"{name} is not a finite number")


def _finite_float(text: str) -> float:
    """A JSON number as a float, refused when it overflows: ``1e400`` parses to infinity
    without ever spelling ``Infinity``."""
    value = float(text)
    return value if math.isfinite(value) else _not_finite(text[:40])


def parse_document(result: RunResult) -> tuple[dict[str, Any] | None, str | None]:
    """The probe's JSON document from its stdout, or a one-line reason it is unusable."""
    if not result.state.ran:
        return None, f"{result.state.value}: {_clip(result.stderr.strip())}"
    # The size is what the transport counted, never read from the text: a node can print a
    # line that looks like the truncation marker.
    # Kept whole: its exact bytes where they are not UTF-8 (each bad byte is 3 in the text).
    size = (result.stdout_total if result.stdout_total is not None
            else len(result.stdout_bytes) if result.stdout_bytes is not None
            else len(result.stdout.encode()))
    if size > PROBE_DOC_MAX:
        return None, f"probe answer too large: {size} bytes (at most {PROBE_DOC_MAX}); refused"
    if result.stdout_total is not None:
        return None, (f"probe answer cut: {size} bytes, more than ssh.output_keep keeps at each "
                      "end; refused")
    lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
    if not lines:
        tail = result.stderr.strip().splitlines()[-1:] or ["no output"]
        return None, f"probe printed nothing (exit {result.exit_code}): {_clip(tail[0])}"
    try:
        doc = json.loads(lines[-1], parse_constant=_not_finite, parse_float=_finite_float)
    except NotFinite as exc:  # Python's json reads NaN and Infinity: numbers are finite here
        return None, f"probe answer refused: {exc}"
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        return None, f"probe output is not JSON: {lines[-1][:200]!r}"
    if not isinstance(doc, dict):
        return None, "probe output is not a JSON object"
    if "probe_error" in doc:
        why = doc["probe_error"]  # printed only as a string: repr of deep nesting recurses too
        return None, f"probe failed on the node: {why if isinstance(why, str) else type(why).__name__}"
    return doc, None


class ProbeRunner:
    """Runs probe modules over a transport, shipping the code once per node and version."""

    def __init__(self, transport: Transport, bundle: Bundle | None = None) -> None:
        """Args: transport: the backend; bundle: the code to ship (default: this brctl)."""
        self.transport = transport
        self.bundle = bundle or probe_bundle()
        self.bytes_shipped = 0
        self._lock = threading.Lock()

    def _bootstrap(self, spec: Mapping[str, Any]) -> list[str]:
        # -S: site runs in launch, after the checks and under the import guard.
        return node_program(_BOOTSTRAP, self.bundle.digest, brctl.__version__,
                            json.dumps(spec, separators=(",", ":")))

    def _argv(self, node: Node, module: str, args: Iterable[str] = (), *,
              as_job: bool = False) -> list[str]:
        return self._bootstrap({
            "python": node.python, "paths": declared_paths(node), "env": dict(node.env),
            "user": node.job_user, "as_job": as_job, "module": module, "args": list(args)})

    def command(self, node: Node, module: str, *args: str, as_job: bool = False) -> list[str]:
        """The argv that runs probe ``module`` on ``node`` with ``args`` as its ``sys.argv[1:]``.

        For probes that stream bulk data on stdin (so the request travels in argv);
        the bundle must already be cached there (run any probe with ``run`` first).
        """
        return self._argv(node, module, args, as_job=as_job)

    def as_job_user(self, node: Node, argv: Sequence[str]) -> list[str]:
        """``argv`` to run as the node's ``job.user`` (``setpriv``), or unchanged without one.

        The bundle must already be cached on the node (run any probe first).
        """
        if not node.job_user:
            return list(argv)
        return self._bootstrap({"user": node.job_user, "env": dict(node.env), "exec": list(argv)})

    def run(
        self,
        nodes: Iterable[Node],
        module: str,
        request: Request,
        *,
        timeout: float | None = None,
        concurrency: int = 64,
        on_done: Callable[[RunResult], None] | None = None,
        as_job: bool = False,
    ) -> dict[str, ProbeResult]:
        """Run probe ``module`` (e.g. ``brctl.diagnostics.sysinfo``) on every node.

        ``as_job``: run it as the node's ``job.user`` when one is set (a workload
        that runs job-like code), not only where job-writable code requires it.

        Returns:
            ``{node: ProbeResult}``; a node's garbage or failure is in ``error``, never raised.
        """
        todo = list(nodes)

        def stdin_for(node: Node) -> bytes:
            req = request(node) if callable(request) else request
            return json.dumps(dict(req)).encode()

        def argv_for(node: Node) -> list[str]:
            return self._argv(node, module, as_job=as_job)

        def finished(res: RunResult) -> None:
            # Progress as each node finishes; a node that asks for the bundle is not done yet.
            if on_done is not None and not _is_missing(res):
                on_done(res)

        results = dict(run_all(self.transport, todo, argv_for, timeout=timeout, stdin=stdin_for,
                               concurrency=concurrency, on_done=finished))
        missing = [n for n in todo if _is_missing(results[n.name])]
        if missing:
            shipped = self.ship(missing, self.bundle, timeout=timeout, concurrency=concurrency)
            retry = [n for n in missing if shipped[n.name].state is NodeState.OK]
            for n in missing:
                if shipped[n.name].state is not NodeState.OK:
                    results[n.name] = shipped[n.name]
                    finished(shipped[n.name])
            results.update(run_all(self.transport, retry, argv_for, timeout=timeout,
                                   stdin=stdin_for, concurrency=concurrency, on_done=finished))
        out: dict[str, ProbeResult] = {}
        for node in todo:
            res = refused(results[node.name])
            doc, err = parse_document(res)
            out[node.name] = ProbeResult(node.name, res, doc, err)
        return out

    def ship(
        self,
        nodes: list[Node],
        bundle: Bundle,
        *,
        timeout: float | None = None,
        concurrency: int = 64,
    ) -> Results:
        """Install ``bundle`` into each node's cache (atomic, checked); counts bytes sent."""
        argv = lambda node: node_program(_INSTALLER, bundle.digest, bundle.name,  # noqa: E731
                                         oct(bundle.mode)[2:])
        results = run_all(self.transport, nodes, argv, timeout=timeout, stdin=bundle.data,
                          concurrency=concurrency)
        with self._lock:
            self.bytes_shipped += len(bundle.data) * len(nodes)
        return results

    def ensure_file(
        self, nodes: list[Node], bundle: Bundle, *, timeout: float | None = None
    ) -> dict[str, str | RunResult]:
        """Make ``bundle`` present on each node; returns its path there, or the failed result."""
        argv = lambda node: node_program(_CHECK_FILE, bundle.digest, bundle.name)  # noqa: E731
        checked = run_all(self.transport, nodes, argv, timeout=timeout)
        out: dict[str, str | RunResult] = {}
        need = []
        for node in nodes:
            res = checked[node.name]
            path = res.stdout.strip()
            if res.state is NodeState.OK and path:
                out[node.name] = path
            elif res.state.ran:
                need.append(node)
            else:
                out[node.name] = res
        if need:
            for name, res in self.ship(need, bundle, timeout=timeout).items():
                out[name] = res.stdout.strip() if res.state is NodeState.OK else res
        return out


def probe_call(argv: Sequence[str]) -> tuple[str, list[str]]:
    """The probe module and its arguments in an argv made by ``ProbeRunner`` (for fake machines)."""
    spec = json.loads(argv[-1])
    return spec["module"], list(spec.get("args", []))


def declared_paths(node: Node) -> list[str]:
    """The ``PYTHONPATH`` entries the node's inventory ``env`` declares, in order."""
    return [p for p in node.env.get("PYTHONPATH", "").split(":") if p]


def refused(res: RunResult) -> RunResult:
    """A probe's ``refused`` answer (``isolate.refuse``) as the node state ``refused``, with why."""
    if res.exit_code != REFUSED_EXIT:
        return res
    for line in res.stdout.splitlines():
        if line.startswith(REFUSED_MARK + " "):
            try:
                why = json.loads(line[len(REFUSED_MARK) + 1:])
            except (ValueError, RecursionError):
                continue
            if not isinstance(why, str):
                continue
            return dataclasses.replace(res, state=NodeState.REFUSED, stderr=str(why),
                                       stderr_total=None, stderr_bytes=None)
    return res


def _is_missing(res: RunResult) -> bool:
    return res.exit_code == MISSING_EXIT and MISSING_MARK in res.stdout
