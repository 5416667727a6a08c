"""Node side: probes that run ON the GPU machines (standard library only at top level).

A probe module reads one JSON request on stdin and writes one JSON document on
stdout (``protocol.serve``). Probes import only other probe modules. The parsers
and analysers of probe output may sit beside them, but run on the controller.
"""
