"""Test-only silent data corruption for ``brctl replay``: a ``sitecustomize`` for one node.

``write_fault(directory)`` writes a ``sitecustomize.py`` that, once torch is
imported in that process, wraps ``torch.matmul`` so that one matmul output per
training step gets one bit flipped (bit 22 of its last float: a wrong value, not
a NaN). Put ``directory`` on one node's ``PYTHONPATH`` in the test inventory; no
production code knows about it. With ``once=MARKER`` the fault fires only in the
first process that imports torch on that node (it creates ``MARKER``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

_SOURCE = '''
import importlib.abc, importlib.machinery, os, sys

ONCE = {once!r}


def _patch(torch):
    if ONCE is not None:
        try:
            os.close(os.open(ONCE, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    real = torch.matmul
    calls = [0]

    def matmul(a, b, *args, **kwargs):
        out = real(a, b, *args, **kwargs)
        calls[0] += 1
        if calls[0] % 17 == 5 and out.is_floating_point() and out.numel():
            with torch.no_grad():
                out.data.view(-1)[-1:].view(torch.int32).bitwise_xor_(1 << 22)
        return out

    torch.matmul = matmul


class _AfterTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AfterTorch())
'''


def write_fault(directory: Path, once: Optional[Path] = None) -> dict[str, str]:
    """Write the sitecustomize; returns the node ``env:`` that activates it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(
        _SOURCE.format(once=str(once) if once is not None else None))
    return {"PYTHONPATH": str(directory)}
