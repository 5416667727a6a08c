"""Shared by the fault sitecustomizes: patch torch.distributed right after it is imported.

A meta-path finder wraps the loader of ``torch.distributed`` so ``patch(module)`` runs
once the real module is loaded; processes that never import torch pay nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any, Callable


def install(patch: Callable[[Any], None]) -> None:
    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name != "torch.distributed":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            original = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                original(module)
                patch(module)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, _Hook())
