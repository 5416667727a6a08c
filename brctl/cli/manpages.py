"""Generate brctl's man pages from the CLI: ``python -m brctl.cli.manpages [--check] [DIR]``.

Writes ``brctl.1`` (global options, commands, exit status) and ``brctl-<cmd>.1`` for
every subcommand (a command group such as ``ckpt`` gets one page listing its
subcommands). Output is deterministic (no dates), so a test can regenerate the
pages and fail on drift. ``brctl-inventory.5`` is written by hand.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import brctl

EXIT_STATUS = [
    ("0", "ran; nothing wrong found"),
    ("1", "ran; findings: faulty machines, failed checks, non-zero remote exits, an eviction "
          "proposed, replay found/ambiguous/not_reproduced"),
    ("2", "usage, inventory, playbook or input error (the message names what and where)"),
    ("3", "incomplete: some nodes unreachable, timed out, auth or host key refused, or replay "
          "groups could not run; no verdict on them (takes precedence over 1)"),
    ("4", "refused: a safety limit stopped an action (eviction cap, a live job under a stop-time "
          "check without --force, another daemon holds the job's lease)"),
    ("70", "internal error (a bug; --debug shows the traceback)"),
    ("130", "interrupted"),
]


def _roff(text: str) -> str:
    out = []
    for line in text.splitlines():
        line = line.replace("\\", "\\e").replace("-", "\\-")
        if line.startswith((".", "'")):
            line = "\\&" + line
        out.append(line)
    return "\n".join(out)


def _paragraphs(text: str) -> str:
    paras = [p.strip() for p in (text or "").split("\n\n") if p.strip()]
    return "\n.PP\n".join(_roff(" ".join(p.split())) for p in paras)


def _header(name: str, section: int, summary: str) -> list[str]:
    return [
        f'.TH {name.upper()} {section} "" "brctl {brctl.__version__}" "brctl manual"',
        ".SH NAME",
        f"{_roff(name)} \\- {_roff(summary)}",
    ]


def _first_line(text: str | None) -> str:
    return (text or "").strip().split("\n")[0].rstrip(".")


def _options(params: list[Any]) -> list[str]:
    lines: list[str] = []
    for p in params:
        if getattr(p, "hidden", False) or p.name == "help":
            continue
        if type(p).__name__.endswith("Argument"):
            label = f"\\fI{_roff(p.metavar or p.name.upper())}\\fR"
        else:
            flags = ", ".join(f"\\fB{_roff(o)}\\fR" for o in [*p.opts, *p.secondary_opts])
            takes = not (getattr(p, "is_flag", False) or getattr(p, "count", False))
            label = flags + (f" \\fI{_roff(p.metavar or 'VALUE')}\\fR" if takes else "")
        lines += [".TP", label, _roff(" ".join((getattr(p, "help", None) or "").split()))]
    return lines


def _synopsis(path: str, cmd: Any) -> str:
    args = " ".join(_roff(p.metavar or p.name.upper()) for p in cmd.params
                    if type(p).__name__.endswith("Argument"))
    sub = " COMMAND" if hasattr(cmd, "commands") else ""
    return f"\\fB{_roff(path)}\\fR [OPTIONS]{sub} {args}".rstrip()


README = Path(brctl.__file__).resolve().parent.parent / "README.md"
_COMMAND = re.compile(r"`(brctl [^`]+)`")


def readme_examples(readme: Path = README) -> list[tuple[str, str, str]]:
    """``(situation, command line, what you get)`` from the README's "What to run when" table.

    One source for both: the README is what people read first, the man pages repeat it
    under EXAMPLES of the page of each command it names. Empty outside a checkout.
    """
    if not readme.is_file():
        return []
    text = readme.read_text(encoding="utf-8")
    section = text.split("## What to run when", 1)[-1].split("\n## ", 1)[0]
    rows: list[tuple[str, str, str]] = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0].startswith(("the job", "---")):
            continue
        for command in _COMMAND.findall(cells[1]):
            rows.append((f"the job {cells[0]}", command, cells[2].replace("`", "")))
    return rows


# Per-command examples beside the README's situations: (command line, what it does).
# Every page gets EXAMPLES; a command the "what to run when" table names gets both.
EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "evict": [
        ("brctl evict gpu017 --reason 'xid 79: fell off the bus'",
         "Quarantine gpu017, drain it in the scheduler; the daemon swaps a standby in."),
        ("brctl evict 'gpu[017,042]' --dry-run --reason ecc",
         "Check the caps for both and show the commands; change nothing."),
        ("brctl evict gpu017 --force --by alice --reason 'rack r03 power'",
         "Go past an eviction cap; recorded with the operator and the reason, and notified."),
    ],
    "unevict": [
        ("brctl unevict gpu017 --dry-run", "Say what returning gpu017 would change."),
        ("brctl unevict 'gpu[017,042]' --by alice",
         "Return both to service (job.unevict_command tells the scheduler)."),
    ],
    "exec": [
        ("brctl exec -w @job nvidia-smi -L", "List the GPUs of every job machine."),
        ("brctl exec -w @rack:r01 -x gpu003 -t 20 -- df -h /data",
         "A rack but one machine, 20 seconds each."),
        ("echo 3 | brctl exec -w 'gpu[001-004]' -s -- tee /proc/sys/vm/drop_caches",
         "Send brctl's standard input to the command on every machine."),
    ],
    "nodes": [
        ("brctl nodes", "The inventory's machines, the job and the pool."),
        ("brctl nodes --probe -w @standby", "Contact the pool: Python, hostname, CPUs, GPUs."),
        ("brctl nodes -f gpu001 gpu002 gpu003", "Fold names into a node set: gpu[001-003]."),
        ("brctl nodes -c '@job&@rack:r01'", "Count the job's machines in rack r01."),
    ],
    "standby": [
        ("brctl standby size --machines 1200 --daily-failure-rate 0.00214 --window 24",
         "How many warm machines cover a day's failures at P99."),
        ("brctl standby check --dry-run -w @standby", "Which pool machines it would check, how."),
        ("brctl standby list", "Each pool machine: checked, failed, untested or in use."),
    ],
    "simulate": [
        ("brctl simulate --machines 1200 --days 90 --runs 10 --sweep standby.size=0,4,8,16",
         "The ETTR of three months per warm pool size, under the daemon's own policy."),
        ("brctl simulate --sweep daemon.poll=5,30,60 --set durations.restart=120",
         "The inventory's job, poll intervals swept, with 2-minute restarts."),
        ("brctl simulate --mix history -o sim.html",
         "Replay this job's own recorded incidents; write the picture as an HTML page."),
    ],
    "init": [
        ("brctl init --local", "Write ./inventory.yaml: four local machines and a standby."),
        ("brctl init --example -o /etc/brctl/inventory.yaml",
         "The commented reference of every key, to edit."),
    ],
    "completion": [
        ("brctl completion bash > ~/.local/share/bash-completion/completions/brctl",
         "Install bash completion (machines and @groups from the inventory)."),
        ('eval "$(brctl completion zsh)"', "Completion in this shell only."),
    ],
}


def _examples(name: str | None) -> list[str]:
    """EXAMPLES for ``brctl NAME`` (None: the root page, every README row)."""
    rows = [r for r in readme_examples() if name is None or r[1].split()[1] == name]
    own = EXAMPLES.get(name, []) if name else []
    if not rows and not own:
        return []
    lines = [".SH EXAMPLES"]
    for situation, command, gets in rows:
        lines += [".TP", f"\\fB{_roff(command)}\\fR", _roff(f"When {situation}: {gets}.")]
    for command, does in own:
        lines += [".TP", f"\\fB{_roff(command)}\\fR", _roff(does)]
    return lines


def _exit_status() -> list[str]:
    lines = [".SH EXIT STATUS"]
    for code, meaning in EXIT_STATUS:
        lines += [".TP", f"\\fB{code}\\fR", _roff(meaning)]
    return lines


def _command_page(name: str, cmd: Any) -> str:
    path = f"brctl {name}"
    lines = _header(f"brctl-{name}", 1, _first_line(cmd.help))
    lines += [".SH SYNOPSIS", _synopsis(path, cmd), ".SH DESCRIPTION", _paragraphs(cmd.help or "")]
    opts = _options(cmd.params)
    if opts:
        lines += [".SH OPTIONS", *opts]
    for sub_name, sub in sorted(getattr(cmd, "commands", {}).items()):
        lines += [f".SH {_roff(path.upper())} {_roff(sub_name.upper())}",
                  _synopsis(f"{path} {sub_name}", sub), ".PP", _paragraphs(sub.help or "")]
        sub_opts = _options(sub.params)
        if sub_opts:
            lines += [".PP", "Options:", *sub_opts]
    lines += _examples(name)
    lines += _exit_status()
    lines += [".SH SEE ALSO", "\\fBbrctl\\fR(1), \\fBbrctl\\-inventory\\fR(5)"]
    return "\n".join(lines) + "\n"


def _root_page(root: Any) -> str:
    lines = _header("brctl", 1, _first_line(root.help))
    lines += [".SH SYNOPSIS", "\\fBbrctl\\fR [GLOBAL OPTIONS] COMMAND [OPTIONS] [ARGS]",
              ".SH DESCRIPTION", _paragraphs(root.help or ""),
              ".SH GLOBAL OPTIONS", *_options(root.params), ".SH COMMANDS"]
    for name, cmd in sorted(root.commands.items()):
        lines += [".TP", f"\\fBbrctl\\-{_roff(name)}\\fR(1)", _roff(_first_line(cmd.help))]
    lines += [
        ".SH ENVIRONMENT",
        ".TP", "\\fBBRCTL_INVENTORY\\fR", "Inventory file when \\-i is not given.",
        ".TP", "\\fBBRCTL_STATE\\fR",
        "State directory (SQLite database brctl.db and small state files); default "
        "$XDG_STATE_HOME/brctl or ~/.local/state/brctl.",
        ".TP", "\\fBBRCTL_PLAYBOOKS\\fR", "Extra playbook directory for diagnose.",
        ".TP", "\\fBBRCTL_TIMEOUT_SCALE\\fR", "Multiplies test-relevant timeouts (default 1).",
        ".TP", "\\fBNO_COLOR\\fR", "Disables colour.",
    ]
    lines += _examples(None)
    lines += _exit_status()
    lines += [".SH SEE ALSO", "\\fBbrctl\\-inventory\\fR(5), \\fBclush\\fR(1), \\fBdcgmi\\fR(1)"]
    return "\n".join(lines) + "\n"


def render_pages() -> dict[str, str]:
    """Every generated page: ``{file name: roff text}``."""
    import typer.main

    from brctl.cli.app import build_app

    root = typer.main.get_command(build_app())
    pages = {"brctl.1": _root_page(root)}
    for name, cmd in root.commands.items():  # type: ignore[attr-defined]
        pages[f"brctl-{name}.1"] = _command_page(name, cmd)
    return pages


def main(argv: list[str]) -> int:
    """Write the pages into DIR (default ./man); with --check, report drift and exit 1."""
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    target = Path(args[0]) if args else Path("man")
    pages = render_pages()
    stale = []
    for name, text in pages.items():
        path = target / name
        current = path.read_text() if path.exists() else None
        if current != text:
            stale.append(name)
            if not check:
                target.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    generated = {p.name for p in target.glob("brctl*.1")}
    orphans = sorted(generated - set(pages))
    if check:
        for name in stale + orphans:
            print(f"man/{name} is stale: run python -m brctl.cli.manpages", file=sys.stderr)
        return 1 if stale or orphans else 0
    for name in orphans:
        (target / name).unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
