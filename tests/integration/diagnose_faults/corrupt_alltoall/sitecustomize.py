"""Fault injected by the tests: this machine's all-to-all delivers one wrong element."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _hook import install


def _patch(dist):  # type: ignore[no-untyped-def]
    real = dist.all_to_all_single

    def corrupt(output, input, *args, **kwargs):  # type: ignore[no-untyped-def]
        work = real(output, input, *args, **kwargs)
        output.view(-1)[0] += 1  # a silent bit of corruption on this machine's link
        return work

    dist.all_to_all_single = corrupt


install(_patch)
