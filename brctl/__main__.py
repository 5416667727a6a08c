"""``python -m brctl``."""

from brctl.cli import main

main()
