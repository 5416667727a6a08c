"""Find and read the inventory file: ``-i FILE``, else ``$BRCTL_INVENTORY``, else ./inventory.yaml.

brctl never falls back to local nodes by itself: cron must not run against the
wrong cluster.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import yaml

from brctl.analysis.inventory import Inventory, from_document
from brctl.core.errors import InputError
from brctl.core.schema import SchemaError
from brctl.diagnostics.safefs import unsafe_owner_chain


def find_inventory(explicit: str | None, environ: dict[str, str] | None = None) -> Path:
    """The inventory path by precedence; exit 2 with a hint when there is none."""
    env = os.environ if environ is None else environ
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise InputError(f"inventory {explicit}: no such file", file=explicit)
        return path
    if env.get("BRCTL_INVENTORY"):
        path = Path(env["BRCTL_INVENTORY"]).expanduser()
        if not path.is_file():
            raise InputError(f"inventory {path} (from $BRCTL_INVENTORY): no such file",
                             file=str(path))
        return path
    path = Path("inventory.yaml")
    if path.is_file():
        return path
    raise InputError(
        "no inventory: give -i FILE, set $BRCTL_INVENTORY, or create ./inventory.yaml",
        hint="to try brctl on this host alone: brctl init --local (writes ./inventory.yaml "
        "with four local machines); brctl init --example writes the commented reference",
    )


def load_inventory(path: Path) -> Inventory:
    """Read, parse (strict YAML: UTF-8, no duplicate keys) and validate the inventory.

    Every error names the file and, when it is a place in the text, its line (and
    column for YAML syntax), as a compiler does.
    """
    source = str(path)
    # StrictModes: whoever can write the inventory chooses the hooks brctl runs and where.
    unsafe = unsafe_owner_chain(os.path.abspath(path), tuple({0, os.getuid()}), sticky_ok=True)
    if unsafe:
        raise InputError(
            f"inventory {source}: refused: {unsafe} (only root or you may be able to write "
            "the inventory and its directories)",
            hint="chown it and its directories to root or yourself and chmod go-w", file=source,
        )
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"inventory {source}: cannot read: {exc.strerror}", file=source) from None
    text = utf8_text(raw, source)
    data, root = _parse_with_nodes(text, source)
    try:
        inv = from_document(data, source)
    except SchemaError as exc:
        line = line_of(text, exc.path)
        raise (exc.at_line(line) if line is not None else exc) from None
    return dataclasses.replace(inv, lines=_lines(root, LATE_KEYS) if root is not None else {})


# Keys whose values are checked after loading (analysis.jobtopo): their lines are kept.
LATE_KEYS = ("job", "job.nodes", "job.tp", "job.pp", "job.cp", "job.ep", "job.order")


def utf8_text(raw: bytes, source: str) -> str:
    """``raw`` decoded as UTF-8, or an error at the first byte that is not."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InputError(f"{source}:{line}:{column}: not UTF-8 text (byte 0x{raw[exc.start]:02x})",
                         hint="save the file as UTF-8", file=source, line=line) from None


class _Strict:
    """A mixin for a ``SafeLoader`` that refuses a key written twice in one mapping.

    PyYAML keeps the last value silently: ``gpus: 8`` then ``gpus: 4`` would be 4
    GPUs with no word said.
    """

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # << merges may repeat keys on purpose
                key = self.construct_object(key_node, deep=True)  # type: ignore[attr-defined]
                if not isinstance(key, Hashable):
                    continue  # the base class reports it
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"duplicate key {key!r} (first at line {seen[key] + 1})",
                        key_node.start_mark)
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)  # type: ignore[misc, no-any-return]


class _StrictLoader(_Strict, yaml.SafeLoader):
    """The pure-Python strict loader: the one whose errors are reported (exact marks)."""


# libyaml's parser, where PyYAML was built with it, reads an inventory ~10x faster
# (the pure-Python one was half of `brctl exec`'s inventory time). Same resolver and
# constructor, so the same data; on any error the pure loader re-reads the text, so
# messages, lines and columns are exactly its own (libyaml counts bytes in some).
_FastStrictLoader: type | None = None
if getattr(yaml, "__with_libyaml__", False):
    class _CStrictLoader(_Strict, yaml.CSafeLoader):
        """The strict loader over libyaml (a fast path; never the one that reports)."""

    _FastStrictLoader = _CStrictLoader


# Where libyaml and the pure loader were seen to disagree (a differential fuzz, kept as
# tests/unit/test_yaml_loaders_agree.py: libyaml accepts tabs after ':', '?' inside flow
# scalars, a second BOM, ...): text with any of these takes the pure loader alone, so
# no file reads differently than it always did.
# A block scalar's indicator followed at once by "#" (``key: |#x``): libyaml takes the
# "#" for a comment (an empty string), the pure loader refuses it, as YAML does (a
# comment needs a space before it); tests/unit/test_yaml_loaders_agree.py found it.
_PURE_ONLY = re.compile("[\t\ufeff!%?\x85\u2028\u2029\r]|[|>][-+0-9]*#")


def _parse_with_nodes(text: str, source: str) -> tuple[Any, Any]:
    """The YAML document in ``text`` and its node tree (for lines); errors as ``parse_yaml``."""
    if _FastStrictLoader is not None and not _PURE_ONLY.search(text):
        try:
            loader = _FastStrictLoader(text)
            try:
                root = loader.get_single_node()
                return (loader.construct_document(root) if root is not None else None), root
            finally:
                loader.dispose()
        except yaml.YAMLError:
            pass  # reported below, by the pure loader
    def read() -> tuple[Any, Any]:
        pure = _StrictLoader(text)  # its reader already refuses characters YAML forbids
        try:
            root = pure.get_single_node()
            return (pure.construct_document(root) if root is not None else None), root
        finally:
            pure.dispose()

    return _report_errors(read, text, source)  # type: ignore[no-any-return]


def parse_yaml(text: str, source: str) -> Any:
    """The YAML document in ``text``; errors as ``file:line:column: what``."""
    return _parse_with_nodes(text, source)[0]


def _report_errors(step: Callable[[], Any], text: str, source: str) -> Any:
    """``step()``, a YAML error raised as an InputError naming ``source``:line:column."""
    try:
        return step()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        if isinstance(exc, yaml.reader.ReaderError):  # a character YAML refuses (NUL, ...)
            at = exc.position
            line, column = text.count("\n", 0, at) + 1, at - (text.rfind("\n", 0, at) + 1) + 1
            raise InputError(f"{source}:{line}:{column}: malformed YAML: character "
                             f"{exc.character!r} is not allowed in YAML", file=source,
                             line=line) from None
        if mark is None:
            raise InputError(f"{source}: malformed YAML: {problem}", file=source) from None
        key = _path_at(text, mark.line, mark.column) if "duplicate key" in problem else None
        raise InputError(f"{source}:{mark.line + 1}:{mark.column + 1}: malformed YAML: {problem}",
                         file=source, key=key, line=mark.line + 1) from None


def _path_at(text: str, line: int, column: int) -> str | None:
    """The key path (``nodes[1].gpus``) of the key written at ``line``:``column`` (0-based)."""
    try:
        node: Any = yaml.compose(text, Loader=yaml.SafeLoader)  # keeps a repeated key
    except yaml.YAMLError:
        return None
    path = ""
    while node is not None:
        if isinstance(node, yaml.MappingNode):
            for key, _ in node.value:
                if (key.start_mark.line, key.start_mark.column) == (line, column):
                    return f"{path}.{key.value}".lstrip(".")
            inside = [(k, v) for k, v in node.value if _holds(v, line, column)]
            if not inside:
                return None
            path, node = f"{path}.{inside[-1][0].value}", inside[-1][1]
        elif isinstance(node, yaml.SequenceNode):
            items = [(i, v) for i, v in enumerate(node.value) if _holds(v, line, column)]
            if not items:
                return None
            path, node = f"{path}[{items[-1][0]}]", items[-1][1]
        else:
            return None
    return None


def _holds(node: Any, line: int, column: int) -> bool:
    """Whether ``node``'s text spans the place ``line``:``column``."""
    start = (node.start_mark.line, node.start_mark.column)
    return start <= (line, column) < (node.end_mark.line, node.end_mark.column)


_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def line_of(text: str, path: str) -> int | None:
    """The line (1-based) of the key path ``nodes[2].gpus`` in the YAML ``text``.

    The deepest part of the path present in the text: a missing key is reported on
    the line of the mapping that lacks it.
    """
    try:
        root: Any = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    return _line_in(root, path)


def lines_of(text: str, paths: tuple[str, ...]) -> dict[str, int]:
    """``{path: line}`` for each of ``paths`` written in ``text`` (the YAML read once)."""
    try:
        root: Any = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    return _lines(root, paths)


def _lines(root: Any, paths: tuple[str, ...]) -> dict[str, int]:
    found = {path: _line_in(root, path) for path in paths}
    return {path: line for path, line in found.items() if line is not None}


def _line_in(node: Any, path: str) -> int | None:
    line = None
    for key, index in _STEP.findall(path):
        if key and isinstance(node, yaml.MappingNode):
            found = next(((k, v) for k, v in node.value if k.value == key), None)
            if found is None:
                break
            line, node = found[0].start_mark.line + 1, found[1]
        elif index and isinstance(node, yaml.SequenceNode) and int(index) < len(node.value):
            node = node.value[int(index)]
            line = node.start_mark.line + 1
        else:
            break
    if line is None and node is not None:
        line = node.start_mark.line + 1
    return line
