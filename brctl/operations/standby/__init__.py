"""``brctl standby``: the warm pool's size (``analysis.standby``), check and list (``ops``),
and the standby self-check (``selfcheck``: the health sweep, then the diagnose ladder's
machine-local stages) the daemon also runs before it swaps a machine in."""
