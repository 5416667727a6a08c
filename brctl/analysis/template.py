"""Command templates (``job.restart_command``, ``evict_command``, replay's ``--command``).

A template is an argv list, or a string split like a shell (``shlex.split``), with
``{placeholder}`` fields substituted per argument — the result is an argv list
that is never passed through a shell (DESIGN.md, "Templates"). An unknown
placeholder is an error naming the template and the field, never a silent
empty string.
"""

from __future__ import annotations

import shlex
import string
from collections.abc import Mapping, Sequence
from typing import Union

from brctl.errors import InputError

Template = Union[str, Sequence[str]]

PLACEHOLDERS = ("nodes", "nodes_folded", "node", "reason", "nnodes", "node_rank",
                "nproc_per_node", "master_addr", "master_port")


def expand(template: Template, values: Mapping[str, object], *, what: str) -> list[str]:
    """Substitute ``values`` into every argument of ``template``.

    Args:
        template: an argv list or a shell-like string.
        values: placeholder name → value (str() is used).
        what: where the template comes from, for errors (e.g. ``job.restart_command``).

    Returns:
        The argv list.

    Raises:
        InputError: the template is empty, malformed, or uses a placeholder not in ``values``.
    """
    try:
        argv = shlex.split(template) if isinstance(template, str) else list(template)
    except ValueError as exc:
        raise InputError(f"{what}: cannot split {template!r}: {exc}") from None
    if not argv:
        raise InputError(f"{what}: empty command")
    out = []
    for arg in argv:
        try:
            names = [name for _t, name, _s, _c in string.Formatter().parse(arg) if name is not None]
            unknown = [name for name in names if name not in values]
            if not unknown:
                out.append(arg.format_map({k: str(v) for k, v in values.items()}))
        except (ValueError, IndexError, AttributeError) as exc:
            raise InputError(f"{what}: bad placeholder in {arg!r}: {exc}",
                             hint="write a literal brace as {{ or }}") from None
        if unknown:
            known = ", ".join("{" + k + "}" for k in values)
            raise InputError(f"{what}: unknown placeholder {{{unknown[0]}}} in {arg!r}",
                             hint=f"available here: {known}")
    return out
