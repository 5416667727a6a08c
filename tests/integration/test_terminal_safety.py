"""Node bytes are text, never markup or terminal commands: a real ``brctl`` process, output piped.

A node (real sshd, and a ``connection: local`` one) prints rich-markup lookalikes, ANSI CSI
and OSC 52 (clipboard write) sequences, a line ending in a backslash, an emoji shortcode and
invalid UTF-8, on stdout and stderr. ``brctl exec`` must exit 0, show every control character
escaped (``\\x1b``), every other character as itself, and never send a raw ESC/BEL to the
terminal; ``--json`` carries the decoded text and, as the bytes are not UTF-8, the exact bytes.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import yaml

from tests.conftest import validated
from tests.kits.cluster import SshCluster, scaled

ROOT = Path(__file__).resolve().parents[2]

# printf formats: markup lookalikes, a colour (CSI), an OSC 52 clipboard write ended by BEL,
# a cursor-up + erase-line, a carriage return, a trailing backslash (rich.markup.escape doubles
# one), an emoji shortcode, then two bytes that are not UTF-8.
HOSTILE = (r"a \\[/] b [bold]x[/bold] [/]\n\033[31mred\033[0m\n\033]52;c;SGVsbG8=\a\n"
           r"\033[1A\033[2K\rover\ndir C:\\\n:smiley: x\n\377\376 bad\n")
DECODED = ("a \\[/] b [bold]x[/bold] [/]\n\x1b[31mred\x1b[0m\n\x1b]52;c;SGVsbG8=\x07\n"
           "\x1b[1A\x1b[2K\rover\ndir C:\\\n:smiley: x\n\ufffd\ufffd bad\n")
EXACT = DECODED.encode().replace("\ufffd\ufffd".encode(), b"\xff\xfe")
SHOWN = ["a \\[/] b [bold]x[/bold] [/]", "\\x1b[31mred\\x1b[0m", "\\x1b]52;c;SGVsbG8=\\x07",
         "\\x1b[1A\\x1b[2K\\x0dover", "dir C:\\", ":smiley: x", "\ufffd\ufffd bad"]


def _cli(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "brctl", *map(str, args)], capture_output=True,
                          env=env, cwd=ROOT, timeout=scaled(120))


def _inventory(cluster: SshCluster, tmp_path: Path) -> Path:
    inv = cluster.inventory()
    inv["nodes"].append({"name": "here", "connection": "local"})
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(inv))
    return path


def test_hostile_node_output_is_shown_escaped_and_exact_in_json(
        make_cluster: Callable[..., SshCluster], tmp_path: Path) -> None:
    inv = _inventory(make_cluster(1), tmp_path)
    script = f"printf '{HOSTILE}'; printf '{HOSTILE}' >&2"
    proc = _cli("-i", inv, "exec", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    for stream in (proc.stdout, proc.stderr):
        assert b"\x1b" not in stream and b"\x07" not in stream and b"\r" not in stream
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert "here,node01 (2) ok" in out
    for line in SHOWN:  # remote stdout on stdout, remote stderr on stderr
        assert out.count(line) == 1 and err.count(line) == 1, (line, out, err)
    assert "dir C:\\" in out.splitlines() and "here,node01: dir C:\\" in err.splitlines()
    assert "\U0001f603" not in out + err  # :smiley: stays text

    proc = _cli("-i", inv, "--json", "exec", "--", "sh", "-c", script)
    assert proc.returncode == 0
    assert b"\x1b" not in proc.stdout  # JSON escapes it: \u001b
    doc = validated(json.loads(proc.stdout))
    for name in ("node01", "here"):
        assert doc["nodes"][name]["stdout"] == DECODED
        assert doc["nodes"][name]["stderr"] == DECODED
        assert base64.b64decode(doc["nodes"][name]["stdout_b64"]) == EXACT
        assert base64.b64decode(doc["nodes"][name]["stderr_b64"]) == EXACT


def test_a_failing_node_with_markup_in_its_stderr_is_exit_1_not_a_crash(
        make_cluster: Callable[..., SshCluster], tmp_path: Path) -> None:
    inv = _inventory(make_cluster(1), tmp_path)
    proc = _cli("-i", inv, "exec", "--", "sh", "-c", r"printf 'oops \\[/]\033]0;pwned\a\n' >&2; exit 3")
    assert proc.returncode == 1, proc.stderr.decode(errors="replace")
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert "exit 3" in out and "oops \\[/]\\x1b]0;pwned\\x07" in err
    assert b"\x1b" not in proc.stdout + proc.stderr
