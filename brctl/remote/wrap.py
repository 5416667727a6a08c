"""The node-side supervision every command runs under: a shell start, and the reaper.

``shell_line`` is what a node's login shell is given: ``exec /bin/sh -c START ...``.
``START`` (below) costs a few forks, not an interpreter, so a short command (a
``true``, most probes) is supervised for about the CPU of ``sh -c true`` plus a
``mkdir``, a ``rmdir``, a ``setsid`` and a ``sleep``. It

- finds this session's cgroup v2 directory (``/proc/self/mountinfo``,
  ``/proc/self/cgroup``), and where a dead supervisor left a cgroup ``ORPHAN_S`` past
  its deadline there (or in a sibling logind session), has the reaper sweep them;
- makes the command's cgroup, ``brctl-<deadline>-<16 hex>``, named as the reaper names
  its own (``brctl.diagnostics.reaper``), and runs the command in it in the foreground,
  in a session of its own (``setsid``, as the reaper spawns it: what it sends its
  process group reaches neither the shell nor the watch), with stdin as given (the
  cgroup holds the whole tree from its first instruction: ``setsid`` escapees, double
  forks);
- starts, in the background and outside the cgroup, ``sleep WATCH_AFTER_S`` (or less
  where the timeout is shorter) and then the reaper's ``--watch``: from then on the
  reaper holds the deadline and the lost channel (stdout/stderr's reader gone) and
  kills the cgroup and all below the shell (124, 129) with the reaper's one kill path;
- when the command is over, sends the watch SIGTERM (ignored once it kills: its exit
  code is then the answer; never to a pid the shell has reaped), moves what the command
  left running out of the cgroup (its business, as under plain ``ssh``) and removes it.

Where no cgroup can be made (cgroup v1 only, a non-root user without delegation, no
``mkdir`` or ``setsid``), the shell ``exec``s the reaper instead, which then does
everything itself (a child subreaper and a ``/proc`` walk, or v1's freezer):
``python3 -I -S -c PROGRAM SECONDS ARGV...``, its source travelling in the argv
(compressed: ``PROGRAM`` unpacks and runs it), so nothing has to be installed on the
node. Exit 124 means "killed for its timeout", whatever the command did with SIGTERM.
Signals the session starts with ignored stay ignored for the command (sshd starts it
with none; the reaper reset some).

The shell script is POSIX (dash, and bash as ``sh``), free of backslashes (fish, as a
login shell, reads them inside single quotes), turns off what bash's exported
``SHELLOPTS`` may turn on (errexit, noglob, noclobber, xtrace, ...), and its variables
start ``_b`` (the command's environment is the login one: a shell variable shadowing
an exported one of the same name would change it).
"""

from __future__ import annotations

import ast
import base64
import functools
import math
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path

from brctl.core.transport import NODE_PROGRAM, NodeState, command_line
from brctl.diagnostics.reaper import GRACE_S as GRACE_S  # re-exported: the transports wait this long
from brctl.diagnostics.reaper import MAX_S, ORPHAN_S, TIMEOUT_EXIT  # stdlib only: no import cost to speak of

SLACK_S = 5.0  # how long past GRACE_S the controller waits before it gives up itself
SYSTEM_PYTHON = NODE_PROGRAM[0]  # isolate.TRUSTED_PYTHON: what runs the reaper where it exists
SHELL = "/bin/sh"
WATCH_AFTER_S = 1.0  # a command still running this long gets the reaper's watch

# $1 seconds, $2 whole seconds for the cgroup's name, $3 the watch's delay, $4 python3,
# $5 the configured python (where there is no python3), $6 the reaper's program; then argv.
START = f"""set +Ceufvx
_bfull() {{ exec "$_bpy" -I -S -c "$_bsrc" "$_bt" "$@"; }}
_bold() {{
  for _bd; do
    _be=${{_bd##*/brctl-}}
    _be=${{_be%-*}}
    case $_be in ''|*[!0-9]*|??????????????????*) continue;; esac
    [ "$((_be + {int(ORPHAN_S)}))" -lt "$_bu" ] && return 0
  done
  return 1
}}
_bt=$1 _bn=$2 _bw=$3 _bpy=$4 _bsrc=$6
command -v "$_bpy" >/dev/null 2>&1 || _bpy=$5
shift 6
command -v setsid >/dev/null 2>&1 || _bfull "$@"
_br= _bp=
{{ while read -r _b _b _b _bd _bm _bo; do
  case $_bo in *" - cgroup2 "*) [ "$_bd" = / ] && _br=$_bm && break;; esac
done < /proc/self/mountinfo; }} 2>/dev/null
{{ while IFS= read -r _bl; do
  case $_bl in 0::/*) _bp=${{_bl#0::}};; esac
done < /proc/self/cgroup; }} 2>/dev/null
[ -n "$_br" ] && [ -n "$_bp" ] || _bfull "$@"
_bp=$_br${{_bp%/}}
{{ read -r _bu0 _b < /proc/uptime; }} 2>/dev/null || _bfull "$@"
_bu=${{_bu0%.*}}
case $_bp in
  */session-*.scope) _bold "${{_bp%/*}}"/session-*.scope/brctl-*;;
  *) _bold "$_bp"/brctl-*;;
esac && "$_bpy" -I -S -c "$_bsrc" --sweep "$_bp" </dev/null >/dev/null 2>&1
{{ read -r _bi < /proc/sys/kernel/random/uuid; }} 2>/dev/null || _bfull "$@"
_bj=${{_bi#*-}} _bk=${{_bi#*-*-}}
_bc=$_bp/brctl-$((_bu + _bn))-${{_bi%%-*}}${{_bj%%-*}}${{_bk%%-*}}
mkdir "$_bc" 2>/dev/null || _bfull "$@"
(trap 'kill "$!"; exit' TERM; sleep "$_bw" >/dev/null 2>&1 & wait "$!"
 exec "$_bpy" -I -S -c "$_bsrc" --watch "$_bt" "$_bu0" "$_bc" "$$") </dev/null &
_bw=$!
exec 3>&2 2>/dev/null
(exec 2>&3 3>&-; {{ echo 0 >"$_bc/cgroup.procs"; }} 2>/dev/null || _bfull "$@"; exec setsid -- "$@")
_bx=$?
{{ read -r _bs < "/proc/$_bw/stat"; }} 2>/dev/null
_bs=${{_bs##*) }} _bs=${{_bs#* }}
[ "${{_bs%% *}}" = "$$" ] && kill -TERM "$_bw"
wait "$_bw"
_by=$?
exec 2>&3 3>&-
{{ while read -r _bq; do echo "$_bq" >"$_bp/cgroup.procs"; done <"$_bc/cgroup.procs"; }} 2>/dev/null
rmdir "$_bc" 2>/dev/null
case $_by in 124|129) exit "$_by";; esac
exit "$_bx"
"""


def _source() -> str:
    """The reaper's source as it travels (in ``program``, built once): without docstrings
    and comment lines, which every command would carry (and every login shell parse) for
    nothing."""
    text = (Path(__file__).parent.parent / "diagnostics" / "reaper.py").read_text()
    lines = text.splitlines()
    drop: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            first, last = body[0].lineno, body[0].end_lineno or body[0].lineno
            if len(body) == 1:  # a body of only a docstring keeps a statement
                lines[first - 1] = lines[first - 1][:body[0].col_offset] + "pass"
                first += 1
            drop.update(range(first - 1, last))
    kept = [line for i, line in enumerate(lines)
            if i not in drop and line.strip() and not line.lstrip().startswith("#")]
    return "\n".join(kept) + "\n"


_BUILDING = threading.Lock()


def program() -> str:
    """What ``python3 -c`` is given to run the reaper: its source, compressed. Every
    command line carries it and every login shell parses and copies it, started or not:
    5.5 KB instead of 12.9 (~0.35 ms less node CPU per command). ``zlib`` and
    ``binascii`` come with every CPython a distribution ships (built in, or in
    ``lib-dynload``, which ``-I -S`` keep, as the reaper's ``select``); it holds no
    backslash and no single quote.

    Built once, under a lock: a fan-out's threads all ask at once, and ``functools.cache``
    lets each of them build it meanwhile (up to one ``ast.parse`` per thread, and CPython
    3.11's is not reentrant across threads: it raised SystemError)."""
    with _BUILDING:
        return _program()


@functools.cache
def _program() -> str:
    packed = base64.b64encode(zlib.compress(_source().encode(), 9)).decode()
    return f'import zlib,binascii;exec(zlib.decompress(binascii.a2b_base64("{packed}")))'


def wrapped(python: str, argv: Sequence[str], timeout: float) -> list[str]:
    """``argv`` under the reaper with ``timeout`` seconds, run by ``python``."""
    return [python, "-I", "-S", "-c", program(), repr(float(timeout)), *argv]  # 0.0004 is not 0


def shell_line(python: str, argv: Sequence[str], timeout: float, shell: str = SHELL) -> str:
    """The command line a node's login shell runs: ``argv`` under ``START`` and the reaper.

    The reaper runs under the system ``python3``, the interpreter brctl trusts on a
    node (a configured ``python`` may be one the job user can write: probes check it
    before they run it, the reaper could not). Only a node without ``python3`` on its
    login PATH (a conda-only machine) runs it under its configured ``python``, which
    then must be as trustworthy as any program brctl starts there.
    """
    seconds = float(timeout)
    # nan is the longest; -inf or -1e300 the shortest: numbers the shell can add to
    bounded = min(max(seconds, -MAX_S), MAX_S) if seconds == seconds else MAX_S
    return command_line(["exec", shell, "-c", START, "sh", repr(seconds), str(math.ceil(bounded) + 1),
                         f"{min(WATCH_AFTER_S, max(bounded, 0.0)):g}", SYSTEM_PYTHON, python,
                         program(), *argv])


def exit_state(code: int, elapsed: float, timeout: float) -> NodeState:
    """The state of a command the reaper reported ``code`` for, ``elapsed`` s after start."""
    if code == TIMEOUT_EXIT and elapsed >= timeout * 0.98:
        return NodeState.TIMEOUT
    return NodeState.OK if code == 0 else NodeState.FAILED
