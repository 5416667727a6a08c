"""The command line's frame (layer: face).

``app`` is the root typer app: the global options, the lazy registration of one module per
subcommand (``brctl.commands``), and the one error boundary that turns a ``BrctlError`` into its
exit code and anything else into 70 with no traceback (``--debug`` shows it). ``hoisting`` moves
global options given after the subcommand in front of it; ``coercion`` reads option values
through typer's coercion hooks without pydantic (start-up time); ``manpages`` writes ``man/*.1``
from the app (the drift test keeps them equal).

``brctl --help`` imports nothing heavy: no paramiko, yaml, sqlite3 or torch (tests/unit).
"""
