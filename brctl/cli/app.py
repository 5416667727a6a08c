"""The ``brctl`` command line: global options, subcommand discovery, one error boundary.

Each module in ``brctl/commands/`` defines ``register(app)``; they are found with
pkgutil so adding a subcommand touches nothing here. Command modules import only
typer and brctl's light modules at top level, so ``brctl --help`` stays fast.
``main`` is the only place exceptions become exit codes (the table in brctl(1)).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import os
import pkgutil
import signal
import sys
from typing import Optional, TextIO

import typer

import brctl
from brctl.cli.coercion import install as light_coercion
from brctl.cli.hoisting import hoist, named_command
from brctl.core.errors import BrctlError, ExitCode
from brctl.env import Env
from brctl.render.output import Output, json_document, visible

HELP = """Find the machines that must leave a large training job, with evidence, fast.

Fans out over SSH to the job's GPU machines (see brctl-inventory(5) for the
inventory), runs the right checks there and says which machines must go and
what to do next. Every command has --json (one document on stdout, errors
included: brctl.error/1; python -m brctl.schemas lists the JSON Schemas) and
exits 0 ok, 1 findings, 2 usage or input error, 3 incomplete (nodes unreachable,
a check that could not look), 4 refused by a safety limit, 70 internal error,
130 interrupted. The global options (-i, --json, -v, -q, --utc, --debug) may
also follow the subcommand.
"""


def _version(value: bool) -> None:
    if value:
        typer.echo(f"brctl {brctl.__version__}")
        raise typer.Exit()


# Commands registered by a module of another name (all others: the module's name).
MODULE_OF = {"unevict": "evict"}


def build_app(env: Env | None = None, only: str | None = None) -> typer.Typer:
    """The root typer app with every subcommand registered.

    Args:
        env: the ``Env`` commands receive (tests: a fake transport, string buffers);
            the global options are applied to it. Default: a fresh one per run.
        only: register only the module of this command, when there is one (a run
            names its command: the other ~27 need not be imported and built).
    """
    app = typer.Typer(
        name="brctl",
        help=HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
        rich_markup_mode=None,
    )

    @app.callback()
    def root(
        ctx: typer.Context,
        inventory: Optional[str] = typer.Option(
            None, "-i", "--inventory", metavar="FILE",
            help="Inventory file (default: $BRCTL_INVENTORY, then ./inventory.yaml).",
            show_default=False,
        ),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
        verbose: int = typer.Option(0, "-v", "--verbose", count=True, help="More detail on stderr."),
        quiet: bool = typer.Option(False, "-q", "--quiet",
                                   help="No table on stdout: the exit code (and errors) only."),
        utc: bool = typer.Option(False, "--utc", help="Show times in UTC (default: local time "
                                                      "with its offset)."),
        debug: bool = typer.Option(False, "--debug", help="Show tracebacks of internal errors."),
        version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                     help="Print the version and exit."),
    ) -> None:
        base = env if env is not None else Env()
        given = base.output
        ctx.obj = dataclasses.replace(
            base, inventory_path=inventory or base.inventory_path, debug=debug,
            output=Output(json=json_out, verbose=verbose, quiet=quiet, utc=utc,
                          stdout=given.stdout, stderr=given.stderr),
        )  # fmt: skip
        ctx.call_on_close(ctx.obj.close)

    import brctl.commands as commands

    modules = sorted(m.name for m in pkgutil.iter_modules(commands.__path__)
                     if not m.name.startswith("_"))
    one = MODULE_OF.get(only or "", only)
    if one in modules and one != "completion":  # a script completes every command
        modules = [one]
    for name in modules:
        module = importlib.import_module(f"brctl.commands.{name}")
        module.register(app)
    if os.environ.get("_BRCTL_COMPLETE"):  # a completion script asks for candidates
        from typer._completion_classes import completion_init

        completion_init()
    return app


def _print_error(out: Output, message: str, hint: str | None) -> None:
    # A message may quote a node's bytes: controls are shown escaped, never sent raw, and
    # a newline too (a node's "\nhint: run ..." would be a line that seems brctl's).
    with contextlib.suppress(BrokenPipeError):  # nobody reads stderr: the exit code tells
        out.stderr.write(f"brctl: error: {visible(message, one_line=True)}\n")
        if hint:
            out.stderr.write(f"hint: {visible(hint, one_line=True)}\n")


def _print_traceback(out: Output) -> None:
    """--debug: the exception being handled, with its traceback; its message may quote a
    node's bytes, shown escaped as in every other line (its lines are the traceback's)."""
    import traceback

    with contextlib.suppress(BrokenPipeError):
        out.stderr.write(visible(traceback.format_exc()))


def _report(out: Output, code: int, message: str, hint: str | None, as_json: bool,
            where: BrctlError | None = None, ndjson: bool = False) -> int:
    """The error on the run's stderr, and with --json as the ``brctl.error/1`` document
    on its stdout (the injected Env's streams: a test reads them there); one compact
    line when the run prints NDJSON (``--watch``, ``--follow``)."""
    _print_error(out, message, hint)
    if as_json:
        with contextlib.suppress(BrokenPipeError):
            out.stdout.write(json_document("error", {
                "exit": int(code), "message": message, "hint": hint,
                "file": where.file if where else None, "key": where.key if where else None,
                "line": where.line if where else None}, status=code,
                compact=ndjson) + "\n")
    return int(code)


def run(argv: list[str], env: Env | None = None) -> int:
    """Run the CLI on ``argv`` (with ``env`` when given); return the exit code.

    Never raises, never exits. Global options may follow the subcommand
    (``brctl.cli.hoisting.hoist``); with --json every outcome is one document on stdout.
    """
    import typer.main

    env = env if env is not None else Env()  # built here: errors go to its streams too
    out = env.output
    light_coercion()  # --timeout 30 read without importing pydantic
    complete = bool(os.environ.get("_BRCTL_COMPLETE"))  # candidates: every command's
    command = typer.main.get_command(build_app(env, None if complete else named_command(argv)))
    front, rest = hoist(argv, command)
    debug = "--debug" in front
    as_json = "--json" in front
    ndjson = as_json and _streams(rest)
    try:
        result = command.main(args=front + rest, prog_name="brctl", standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        return _report(out, ExitCode.INTERRUPTED, "interrupted", None, as_json, ndjson=ndjson)
    except typer.TyperException as exc:  # bad options or arguments
        return _report(out, ExitCode.USAGE, exc.format_message(),
                       "run 'brctl --help' (or 'brctl COMMAND --help')", as_json, ndjson=ndjson)
    except BrctlError as exc:
        if debug:
            _print_traceback(out)
        return _report(out, exc.code, exc.message, exc.hint, as_json, exc, ndjson)
    except KeyboardInterrupt:
        return _report(out, ExitCode.INTERRUPTED, "interrupted", None, as_json, ndjson=ndjson)
    except Exception as exc:  # the last line of defence: a bug, not a user error
        if debug:
            _print_traceback(out)
        return _report(out, ExitCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}",
                       "this is a bug in brctl; please report it with the output of --debug",
                       as_json, ndjson=ndjson)
    return int(result or 0)


def _streams(args: list[str]) -> bool:
    """Whether the command prints NDJSON (``--watch``, ``--follow``), its own options read
    up to ``--`` (after it, the words are a remote command's)."""
    own = args[:args.index("--")] if "--" in args else args
    return any(a.split("=", 1)[0] in ("--watch", "--follow") for a in own)


class _PipeSafe(io.TextIOBase):
    """stdout or stderr for a reader that may leave early (``brctl nodes | head -1``,
    ``brctl exec ... 2>&1 >/dev/null | head -1``).

    When the reader closes the pipe, writing raises EPIPE; the rest of the output
    goes to /dev/null instead, quietly, and the command still ends with the exit
    code of the work it did (no traceback, no 'Broken pipe' on stderr).
    """

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        try:
            return self._inner.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._inner.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._inner.fileno())
        os.close(devnull)

    def isatty(self) -> bool:
        return self._inner.isatty()

    def fileno(self) -> int:
        return self._inner.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._inner.encoding


def main() -> None:
    """Console-script entry point."""
    sys.stdout = _PipeSafe(sys.stdout)
    sys.stderr = _PipeSafe(sys.stderr)
    # SIGTERM and SIGHUP take the Ctrl-C path: remote commands are stopped, not orphaned
    # (the daemon's own SIGTERM handler replaces this one while it runs)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    code = run(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    if code == ExitCode.INTERRUPTED:
        os._exit(code)  # worker threads may still wait on hung nodes: do not join them
    sys.exit(code)
