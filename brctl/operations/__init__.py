"""I/O orchestration of each subcommand; returns dataclasses and never prints."""
