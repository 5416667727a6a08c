"""Argv templates: ``restart_command``, ``evict_command``, replay's ``--command``.

A template is an argv list, or a string split like a shell (``shlex.split``); each
argument then has its ``{placeholders}`` substituted on its own. Nothing is ever
passed through a shell, so a node name or a reason cannot inject a command.
"""

from __future__ import annotations

import shlex
import string
from collections.abc import Mapping, Sequence
from typing import Union

from brctl.core.errors import InputError

PLACEHOLDERS = frozenset({
    "nodes", "nodes_folded", "node", "reason", "nnodes", "node_rank", "nproc_per_node",
    "master_addr", "master_port", "job", "version",
})

# What a replay workload command may use (brctl replay --command, daemon.replay_command).
REPLAY_PLACEHOLDERS = frozenset({"nodes", "nodes_folded", "nnodes", "node_rank", "nproc_per_node",
                                 "master_addr", "master_port", "node"})

Template = Union[str, Sequence[str]]


def template_argv(template: Template) -> list[str]:
    """The template as an argv list (a string is split like a shell, quotes honoured)."""
    if isinstance(template, str):
        try:
            return shlex.split(template)
        except ValueError as exc:
            raise InputError(f"command template {template!r}: {exc}") from None
    return list(template)


def placeholders(template: Template) -> set[str]:
    """The placeholder names a template uses."""
    names: set[str] = set()
    for arg in template_argv(template):
        try:
            names.update(f for _, f, _, _ in string.Formatter().parse(arg) if f)
        except ValueError as exc:
            raise InputError(f"command template argument {arg!r}: {exc}") from None
    return names


def check_template(template: Template, where: str, allowed: frozenset[str] = PLACEHOLDERS) -> None:
    """Fail early (exit 2) on an empty template or an unknown placeholder, naming ``where``."""
    argv = template_argv(template)
    if not argv:
        raise InputError(f"{where}: empty command template")
    unknown = placeholders(template) - allowed
    if unknown:
        raise InputError(f"{where}: unknown placeholder {{{sorted(unknown)[0]}}}",
                         hint="placeholders: " + " ".join(f"{{{p}}}" for p in sorted(allowed)))


def render_argv(template: Template, values: Mapping[str, object]) -> list[str]:
    """Substitute ``values`` into each argument of ``template``.

    Raises:
        InputError: a placeholder has no value here.
    """
    out = []
    for arg in template_argv(template):
        try:
            out.append(arg.format_map({k: str(v) for k, v in values.items()}))
        except KeyError as exc:
            raise InputError(f"command template {arg!r}: no value for {{{exc.args[0]}}} here",
                             hint="available: " + " ".join(f"{{{k}}}" for k in sorted(values))) from None
        except (ValueError, IndexError) as exc:
            raise InputError(f"command template argument {arg!r}: {exc}") from None
    return out
