"""Pure functions on typed data: no I/O, no clock, no screen."""
