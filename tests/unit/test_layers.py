"""The design's layers, enforced: every import in brctl/ (top-level and lazy) walked with ast.

``ALLOWED`` is the one table of arrows and ``FOLDERS`` the one table of subsystem folders
(``docs/architecture.md`` shows the same rows; a test keeps them equal). A layer may import
itself and the layers it lists; anything else fails, as does any cycle between packages or
between modules. The size rules (a module cap, a class budget) are here too.
"""

from __future__ import annotations

import ast
import sys
import warnings
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import brctl

PACKAGE = Path(brctl.__file__).resolve().parent
ARCHITECTURE = PACKAGE.parent / "docs/architecture.md"

# Which layer a module belongs to: the longest matching prefix wins.
LAYER_OF = {
    "brctl": "root",  # __init__: the version only; shipped to the nodes with the probes
    "brctl.core": "core",
    "brctl.diagnostics": "node",
    "brctl.config": "config",
    "brctl.analysis": "analysis",
    "brctl.schemas": "analysis",  # the JSON Schemas: data, and the inventory's from its types
    "brctl.remote": "remote",
    "brctl.state": "state",
    "brctl.operations": "operations",
    "brctl.load": "load",  # files in (inventory, playbooks, shipped data), typed values out
    "brctl.render": "render",
    "brctl.env": "env",
    "brctl.commands": "face",
    "brctl.cli": "face",
    "brctl.__main__": "face",
    "brctl.job": "job",  # runs inside the training job: no other module of brctl travels there
}

# The subsystem folders inside the layers: each one's __init__ is its spec (a docstring only).
FOLDERS = {
    "brctl.cli": "face",
    "brctl.render": "render",
    "brctl.load": "load",
    "brctl.operations.daemon": "operations",
    "brctl.operations.ledger": "operations",
    "brctl.operations.ckpt": "operations",
    "brctl.operations.update": "operations",
    "brctl.operations.slurm": "operations",
    "brctl.operations.stacks": "operations",
    "brctl.operations.standby": "operations",
    "brctl.analysis.daemon": "analysis",
    "brctl.analysis.diagnose": "analysis",
    "brctl.analysis.replay": "analysis",
    "brctl.analysis.placement": "analysis",
    "brctl.analysis.health": "analysis",
    "brctl.analysis.stacks": "analysis",
    "brctl.analysis.report": "analysis",
    "brctl.remote.ssh": "remote",
    "brctl.remote.slurm": "remote",
}

# What each layer may import besides itself (every layer may import "root").
ALLOWED: dict[str, frozenset[str]] = {
    "face": frozenset({"env", "render", "operations", "load", "core"}),
    "env": frozenset({"render", "operations", "load", "remote", "state", "analysis", "config",
                      "core"}),
    "render": frozenset({"operations", "analysis", "config", "core"}),
    "operations": frozenset({"analysis", "load", "remote", "state", "config", "core", "node"}),
    "load": frozenset({"analysis", "core", "node"}),
    "state": frozenset({"core"}),
    "remote": frozenset({"core", "node"}),  # probe shipping speaks the node-side protocol (isolate)
    "analysis": frozenset({"config", "core", "node"}),
    "config": frozenset({"core"}),
    "node": frozenset(),
    "core": frozenset(),
    "root": frozenset(),
    "job": frozenset(),  # not even root: it runs in the job, installed with --no-deps or not
}


def module_name(path: Path) -> str:
    parts = ["brctl", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> str:
    best = max((prefix for prefix in LAYER_OF if module == prefix or module.startswith(
        prefix + ".")), key=len)
    return LAYER_OF[best]


def resolve(name: str) -> str:
    """The brctl module an imported name lives in (``brctl.x.y.Cls`` → ``brctl.x.y``)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports(module: str) -> Iterator[tuple[str, int, bool]]:
    """(imported name, line, at top level) for every import statement in ``module``."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, id(node) in top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno, id(node) in top


def brctl_edges() -> dict[str, dict[str, int]]:
    """module → {imported brctl module: first line}, lazy imports included."""
    edges: dict[str, dict[str, int]] = defaultdict(dict)
    for module in MODULES:
        for name, line, _ in imports(module):
            if name == "brctl" or name.startswith("brctl."):
                target = resolve(name)
                if target != module:
                    edges[module].setdefault(target, line)
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package(module: str) -> str:
    """``brctl.remote.ssh`` → ``brctl.remote``; a top-level module is its own package."""
    return ".".join(module.split(".")[:2])


def test_every_module_has_a_layer_and_the_table_is_acyclic() -> None:
    for module in MODULES:
        assert layer(module) in ALLOWED, module
    assert set(LAYER_OF.values()) == set(ALLOWED)
    assert cycles({k: set(v) for k, v in ALLOWED.items()}) == []


def test_every_import_follows_an_arrow_of_the_design() -> None:
    wrong = [
        f"{MODULES[src].relative_to(PACKAGE.parent)}:{line}: {src} ({layer(src)}) imports "
        f"{dst} ({layer(dst)})"
        for src, targets in sorted(brctl_edges().items())
        for dst, line in sorted(targets.items())
        if layer(dst) not in ALLOWED[layer(src)] | {layer(src)}
        | ({"root"} if layer(src) != "job" else set())
    ]
    assert wrong == []


def test_no_cycle_between_packages_or_modules() -> None:
    edges = brctl_edges()
    modules = {src: set(targets) for src, targets in edges.items()}
    packages: dict[str, set[str]] = defaultdict(set)
    for src, targets in edges.items():
        packages[package(src)] |= {package(t) for t in targets if package(t) != package(src)}
    assert cycles(dict(packages)) == []
    assert cycles(modules) == []


def test_core_and_node_side_code_use_the_standard_library_only() -> None:
    """core: stdlib only; node side and job.py: stdlib at top level (torch/pynvml inside
    functions)."""
    stdlib = set(sys.stdlib_module_names)
    wrong = []
    for module in MODULES:
        if layer(module) not in ("core", "node", "root", "job"):
            continue
        for name, line, top in imports(module):
            root = name.split(".")[0]
            if root in stdlib or root == "brctl" or (layer(module) in ("node", "job") and not top):
                continue
            wrong.append(f"{module}:{line}: {name}")
    assert wrong == []


def test_the_architecture_page_shows_the_same_arrows_and_folders() -> None:
    text = ARCHITECTURE.read_text()
    for name, allowed in ALLOWED.items():
        row = f"{name} → {', '.join(sorted(allowed)) or 'nothing'}"
        assert row in text, f"docs/architecture.md lacks the row {row!r}"
    for folder, name in FOLDERS.items():
        row = f"| `{folder.replace('.', '/')}/` | {name} |"
        assert row in text, f"docs/architecture.md lacks the folder row {row!r}"


def packages() -> set[str]:
    return {module_name(p) for p in PACKAGE.rglob("__init__.py")}


def test_every_subsystem_folder_is_in_the_table_with_its_layer_and_spec() -> None:
    """A new folder is declared (``FOLDERS``, docs/architecture.md); its ``__init__`` is its
    spec: a docstring and nothing else, so importing one module of it imports no other."""
    layers = {prefix for prefix in LAYER_OF if prefix.count(".") == 1} - set(FOLDERS)
    assert packages() - layers - {"brctl"} == set(FOLDERS)
    for folder, name in FOLDERS.items():
        assert layer(folder) == name, folder
        body = ast.parse(MODULES[folder].read_text()).body
        assert body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
        assert len(body) == 1, f"{folder}/__init__.py holds more than its spec"


def test_no_flat_module_carries_the_name_of_a_folder_beside_it() -> None:
    """``operations/daemon_x.py`` beside ``operations/daemon/`` belongs in the folder."""
    wrong = [str(path.relative_to(PACKAGE)) for folder in FOLDERS
             for path in MODULES[folder].parent.parent.glob(
                 f"{folder.rpartition('.')[2]}_*.py")]
    assert wrong == []


def test_the_walker_sees_lazy_and_relative_imports() -> None:
    """The checks above are only as good as the walker: a lazy import counts."""
    targets = {name for name, _, top in imports("brctl.cli.app") if not top}
    assert any(name.startswith("brctl.") for name in targets)
    assert layer("brctl.render.health") == "render"
    assert layer("brctl.load.inventory") == "load"
    assert layer("brctl.commands.health") == "face"
    assert layer("brctl.core.errors") == "core"
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


# The size rules (docs/architecture.md, "Size"): crossing a cap moves a responsibility into its
# subsystem's folder; it never shortens a docstring.
MAX_LINES = 600  # a module (failing)
WARN_LINES = 500  # a module nearing the cap: named, not failed
MAX_CLASS_LINES = 300  # a class (failing)
LONG_ALLOWED: set[str] = set()
# Classes over the budget, each with the reason it is allowed for now.
LONG_CLASSES = {
    "brctl.operations.daemon.loop.Daemon": "the loop's one object: split by issue 36 (the joinery)",
    "brctl.operations.ledger.state.DaemonState": "8 tables behind one fence: issue 36 splits it "
                                                 "into per-table repositories in ledger/",
    "brctl.remote.ssh.connect.Connector": "one lock table shared by the attempts it makes; "
                                          "splitting it splits the lock discipline",
    "brctl.remote.ssh.transport.SshTransport": "run and stream share one channel lifecycle "
                                               "(timeouts, output caps, the reaper's signals)",
    "brctl.analysis.placement.plan._Planner": "one search over one mutable state (the "
                                              "candidate placements and their scores)",
}


def test_no_module_is_over_the_line_limit() -> None:
    lines = {module: len(path.read_text().splitlines()) for module, path in MODULES.items()}
    near = [f"{module}: {n} lines" for module, n in sorted(lines.items())
            if WARN_LINES <= n <= MAX_LINES]
    if near:
        warnings.warn(f"{len(near)} modules within {MAX_LINES - WARN_LINES} lines of the cap "
                      f"(the next responsibility moves to its folder): {'; '.join(near)}",
                      stacklevel=1)
    long = [f"{module}: {n} lines" for module, n in lines.items()
            if n > MAX_LINES and module not in LONG_ALLOWED]
    assert long == []


def classes() -> dict[str, int]:
    """``module.Class`` → its lines (nested classes too, each on its own)."""
    found = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found[f"{module}.{node.name}"] = (node.end_lineno or node.lineno) - node.lineno + 1
    return found


def test_no_class_is_over_its_budget() -> None:
    sizes = classes()
    long = [f"{name}: {n} lines" for name, n in sorted(sizes.items())
            if n > MAX_CLASS_LINES and name not in LONG_CLASSES]
    assert long == []
    # an allowed class that is back under the budget, or gone, leaves the list
    assert [name for name in LONG_CLASSES if sizes.get(name, 0) <= MAX_CLASS_LINES] == []
    near = [f"{name}: {n}" for name, n in sorted(sizes.items()) if n > WARN_LINES]
    if near:
        warnings.warn(f"classes over {WARN_LINES} lines: {'; '.join(near)}", stacklevel=1)


def test_comments_cite_only_documents_in_the_repository() -> None:
    """A comment that cites a Markdown file names one a reader can open (from the root)."""
    import re

    root = PACKAGE.parent
    cited = {(path.relative_to(root), name)
             for path in [*PACKAGE.rglob("*.py"), *(root / "tests").rglob("*.py")]
             for name in re.findall(r"[\w./-]+\.md\b", path.read_text())}
    missing = [f"{path}: {name}" for path, name in sorted(cited)
               if not (root / name).exists()]
    assert missing == []
