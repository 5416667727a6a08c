"""brctl: find the machines that must leave a large LLM training job, with evidence, fast.

This module stays import-free: probes ship it to GPU machines, and ``brctl --help``
imports it first.
"""

__version__ = "0.1.0"
