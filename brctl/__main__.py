"""``python -m brctl``."""

from brctl.cli.app import main

main()
