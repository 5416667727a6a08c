"""Node-set syntax (ClusterShell/Slurm style): expand ``gpu[001-016]``, fold names back.

Accepted: ranges, steps and lists in brackets (``a[1-3,7]``, ``gpu[1-16/2]``), several
bracket groups (``r[1-2]n[01-04]``), comma lists at the top level (``a[1-2],b9``), zero
padding taken from the range's first bound and pdsh-lenient (``n[01-128]`` gives
n01..n99, n100..n128). Order is kept as written: machine order in ``job.nodes`` matters.

As ClusterShell's ``nodeset``, the top level also takes the operators ``!``
(difference), ``&`` (intersection) and ``^`` (symmetric difference), applied left to
right with ``,`` (union) at the same precedence: ``gpu[1-8]!gpu3&gpu[2-4]`` is
``gpu[2,4]``. ``@name`` is a group, resolved by the caller's ``groups`` function
(the inventory's ``@all``, ``@job``, ``@standby``, ``@label`` and ``@label:value``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Optional, TypeVar

from brctl.core.errors import InputError

K = TypeVar("K", bound=Hashable)

_MAX_EXPANSION = 1_000_000  # a typo like n[1-99999999] must fail fast, not eat memory
_TOKEN = re.compile(r"(\d+)")
_RANGE_ITEM = re.compile(r"(\d+)(?:-(\d+)(?:/(\d+))?)?")
_GROUP_NAME = re.compile(r"[A-Za-z0-9._:\-]+")
OPERATORS = ",!&^"  # union, difference, intersection, symmetric difference

Groups = Callable[[str], Sequence[str]]
"""Resolves a group's name (without the ``@``) to its machines; raises InputError if unknown."""


def _split_top(pattern: str) -> list[tuple[str, str]]:
    """Split at top-level operators: ``[(operator, item)]``, the first operator ``,``."""
    parts: list[tuple[str, str]] = []
    depth, start, op = 0, 0, ","
    for i, ch in enumerate(pattern):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise InputError(f"node set {pattern!r}: nested '[' at position {i + 1}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InputError(f"node set {pattern!r}: unmatched ']' at position {i + 1}")
        elif depth == 0 and ch in OPERATORS:
            parts.append((op, pattern[start:i]))
            op, start = ch, i + 1
    if depth != 0:
        raise InputError(f"node set {pattern!r}: unclosed '['", hint="close every range: gpu[001-016]")
    parts.append((op, pattern[start:]))
    return parts


def _expand_range(body: str, pattern: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        item = item.strip()
        m = _RANGE_ITEM.fullmatch(item)
        if not m:
            raise InputError(
                f"node set {pattern!r}: bad range item {item!r}",
                hint="ranges look like [1-8], [001-128], [1-16/2] or [1-3,7]",
            )
        lo_s, hi_s, step_s = m.groups()
        lo, hi = int(lo_s), int(hi_s) if hi_s is not None else int(lo_s)
        step = int(step_s) if step_s is not None else 1
        if hi < lo:
            raise InputError(f"node set {pattern!r}: range {item!r} runs backwards")
        if step < 1:
            raise InputError(f"node set {pattern!r}: range {item!r} has a step below 1")
        if hi - lo + 1 > _MAX_EXPANSION:
            raise InputError(f"node set {pattern!r}: range {item!r} is larger than {_MAX_EXPANSION}")
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1, step))
    return out


def _expand_one(part: str, pattern: str) -> list[str]:
    pieces = re.split(r"(\[[^\]]*\])", part)
    names = [""]
    for piece in pieces:
        if piece.startswith("["):
            values = _expand_range(piece[1:-1], pattern)
            names = [n + v for n in names for v in values]
            if len(names) > _MAX_EXPANSION:
                raise InputError(f"node set {pattern!r} expands to more than {_MAX_EXPANSION} names")
        else:
            if not re.fullmatch(r"[A-Za-z0-9._:@\-]*", piece):
                raise InputError(
                    f"node set {pattern!r}: unexpected character in {piece!r}",
                    hint="names use letters, digits, '.', '-', '_' and ranges in [ ]",
                )
            names = [n + piece for n in names]
    return names


def _expand_item(part: str, pattern: str, groups: Optional[Groups]) -> Iterable[str]:
    if not part.startswith("@"):
        return _expand_one(part, pattern)
    name = part[1:]
    if not _GROUP_NAME.fullmatch(name):
        raise InputError(f"node set {pattern!r}: bad group name {part!r}",
                         hint="groups look like @all, @job, @standby, @rack or @rack:r01")
    if groups is None:
        raise InputError(f"node set {pattern!r}: group {part} needs an inventory",
                         hint="give the inventory with -i FILE or $BRCTL_INVENTORY")
    return groups(name)


def _apply(seen: dict[str, None], op: str, names: Iterable[str]) -> dict[str, None]:
    if op == ",":
        for name in names:
            seen.setdefault(name, None)
        return seen
    other = dict.fromkeys(names)
    if op == "!":
        return {n: None for n in seen if n not in other}
    if op == "&":
        return {n: None for n in seen if n in other}
    merged = {n: None for n in seen if n not in other}  # "^": in exactly one of the two
    merged.update((n, None) for n in other if n not in seen)
    return merged


def expand(pattern: str, groups: Optional[Groups] = None) -> list[str]:
    """Expand a node-set pattern into names, in written order, without duplicates.

    Args:
        pattern: ranges, lists, operators and ``@groups`` (module docstring).
        groups: resolves ``@name``; without it a group is an error.

    Raises:
        InputError: the pattern is malformed or names an unknown group (the message says where).
    """
    pattern = pattern.strip()
    if not pattern:
        raise InputError("node set is empty", hint="give names like gpu[001-016]")
    seen: dict[str, None] = {}
    for op, part in _split_top(pattern):
        part = part.strip()
        if not part:
            raise InputError(f"node set {pattern!r}: empty item (nothing on one side of a "
                             f"comma or of an operator {OPERATORS[1:]!r})")
        seen = _apply(seen, op, _expand_item(part, pattern, groups))
    return list(seen)


def _format_ranges(values: Iterable[int], width: int) -> str:
    nums = sorted(set(values))
    runs: list[str] = []
    start = prev = nums[0]
    for n in [*nums[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        lo, hi = str(start).zfill(width), str(prev).zfill(width)
        runs.append(lo if start == prev else f"{lo}-{hi}")
        if n is not None:
            start = prev = n
    return ",".join(runs)


def _width_groups(tokens: Iterable[str]) -> dict[int, set[int]]:
    """Split numeric tokens into padding classes (0 = natural width)."""
    toks = set(tokens)
    padded = {len(t) for t in toks if t.startswith("0") and len(t) > 1}
    groups: dict[int, set[int]] = defaultdict(set)
    for t in toks:
        if t.startswith("0") and len(t) > 1:
            groups[len(t)].add(int(t))
            continue
        # An unpadded token joins a padded class it would print identically in.
        home = max((w for w in padded if w <= len(t)), default=0)
        groups[home].add(int(t))
    return groups


def _fold_group(rows: list[tuple[str, ...]], texts: tuple[str, ...]) -> list[str]:
    """Fold names of one shape; rows are their numeric tokens, texts the text around them."""
    ndim = len(texts) - 1
    if ndim == 0:
        return [texts[0]]
    # Fold the last dimension, then merge prefixes whose folded tails are equal.
    by_prefix: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for row in rows:
        by_prefix[row[:-1]].append(row[-1])
    by_tail: dict[str, list[tuple[str, ...]]] = defaultdict(list)
    for prefix, lasts in by_prefix.items():
        for width, nums in sorted(_width_groups(lasts).items()):
            rng = _format_ranges(nums, width)
            tail = f"[{rng}]" if ("," in rng or "-" in rng) else rng
            by_tail[tail + texts[-1]].append(prefix)
    out: list[str] = []
    for tail, prefixes in by_tail.items():
        head_texts = (*texts[:-2], texts[-2])
        if ndim == 1:
            out.append(texts[0] + tail)
            continue
        for head in _fold_group(prefixes, head_texts):
            out.append(head + tail)
    return out


def fold(names: Iterable[str]) -> str:
    """Fold names into a compact node set (``gpu[001-003,005]``), sorted canonically."""
    shapes: dict[tuple[str, ...], list[tuple[str, ...]]] = defaultdict(list)
    for name in dict.fromkeys(names):
        parts = _TOKEN.split(name)
        texts, nums = tuple(parts[0::2]), tuple(parts[1::2])
        shapes[texts].append(nums)
    folded: list[str] = []
    for texts in sorted(shapes):
        folded.extend(_fold_group(shapes[texts], texts))
    return ",".join(sorted(folded, key=lambda f: _natural_key(f.replace("[", ""))))


def fold_in_order(names: Iterable[str]) -> str:
    """Fold names keeping their order (a rank layout, a group's machines): runs of
    consecutive names fold, ``n[3-5],n1``; ``expand`` reads back the same order."""
    runs: list[list[str]] = []
    last: tuple[str, int, int] | None = None
    for name in dict.fromkeys(names):
        step = _last_number(name)
        if runs and last and step and step == (last[0], last[1] + 1, last[2]):
            runs[-1].append(name)
        else:
            runs.append([name])
        last = step
    return ",".join(fold(run) for run in runs)


def _last_number(name: str) -> tuple[str, int, int] | None:
    """(the name around its last number, that number, its zero-padded width or 0)."""
    parts = _TOKEN.split(name)
    if len(parts) < 3:
        return None
    digits = parts[-2]
    width = len(digits) if len(digits) > 1 and digits.startswith("0") else 0
    return "".join(parts[:-2]) + "\0" + parts[-1], int(digits), width


def _natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(t)) if t.isdigit() else (1, t) for t in _TOKEN.split(name) if t)


def _known(flag: str, pattern: str, available: set[str], groups: Optional[Groups]) -> set[str]:
    names = expand(pattern, groups)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise InputError(
            f"{flag} {pattern!r}: not in the inventory: {fold(unknown)}",
            hint="brctl nodes lists the inventory's machines and groups",
        )
    return set(names)


def select(
    available: Sequence[str], include: str | None, exclude: str | None,
    groups: Optional[Groups] = None,
) -> list[str]:
    """Names of ``available`` (in its order) picked by ``-w`` and not dropped by ``-x``.

    Raises:
        InputError: ``include`` or ``exclude`` names machines that are not in
            ``available``, or an unknown group.
    """
    chosen = list(available)
    known = set(available)
    if include:
        keep = _known("-w", include, known, groups)
        chosen = [n for n in chosen if n in keep]
    if exclude:
        drop = _known("-x", exclude, known, groups)
        chosen = [n for n in chosen if n not in drop]
    return chosen


def fold_by(items: Mapping[str, K]) -> list[tuple[str, K, int]]:
    """Group node names by an equal key: ``[(folded node set, key, count)]``, largest first."""
    groups: dict[K, list[str]] = defaultdict(list)
    for name, key in items.items():
        groups[key].append(name)
    rows = [(fold(names), key, len(names)) for key, names in groups.items()]
    return sorted(rows, key=lambda r: (-r[2], r[0]))
