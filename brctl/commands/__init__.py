"""One module per subcommand: parse options, call one operation, render its result.

Each module defines ``register(app)``. No paramiko, no YAML, no rules here.
"""
