"""Rendering (layer: render): reports in, text and JSON out; never decides an exit code.

``output`` is the ``Output`` every command writes through (``--json``, colour, the escape of
every byte a machine sent, progress lines, stages). One module per command's report
(``health``, ``stacks``, ``daemon``, ...); a command module parses, calls its operation and
hands the report here.
"""
