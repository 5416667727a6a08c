"""Fault injected by the tests: this machine's all-to-all is slow (a deterministic delay).

Every call waits ``DELAY`` seconds before the real exchange, so the machine's
measured bus bandwidth is ~100x below its peers' whatever the CPU load: the
bandwidth verdict on CPU is tested without relying on timing noise.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _hook import install

DELAY = 3.0


def _patch(dist):  # type: ignore[no-untyped-def]
    real = dist.all_to_all_single

    def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(DELAY)  # like a link that trained down to a fraction of its speed
        return real(*args, **kwargs)

    dist.all_to_all_single = slow


install(_patch)
