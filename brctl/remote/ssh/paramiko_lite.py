"""paramiko, imported without ``invoke`` (the ssh modules import it from here).

``paramiko.config`` imports ``invoke`` at module level only to run ``Match
exec``; that is a quarter to a third of the time ``import brctl.remote.ssh.transport``
takes. brctl never lets paramiko evaluate ``Match exec`` (those hosts go to
``ssh -G``: ``brctl.remote.ssh.openssh``), so the import is blocked while
paramiko loads and unblocked at once: paramiko keeps ``invoke = None``, and
anything else that imports ``invoke`` later still gets it.
"""

from __future__ import annotations

import sys

_block = "invoke" not in sys.modules
if _block:
    sys.modules["invoke"] = None  # type: ignore[assignment]  # import invoke → ImportError
try:
    import paramiko
finally:
    if _block and sys.modules.get("invoke") is None:
        del sys.modules["invoke"]

__all__ = ["paramiko"]
