"""Fault injected by the tests: this machine's all-gather never returns."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _hook import install


def _patch(dist):  # type: ignore[no-untyped-def]
    def hang(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(3600)

    dist.all_gather = hang


install(_patch)
